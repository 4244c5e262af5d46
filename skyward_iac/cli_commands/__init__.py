"""Sub-commands of ``skyward-iac`` that need more than a few lines: each module adds its parser."""
