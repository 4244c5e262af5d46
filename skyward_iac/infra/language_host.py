"""The stable ``python -m`` name the installed language-host launcher execs (tools/pulumi/):
the language host itself is infra/engine/language_host.py."""

import sys

from skyward_iac.infra.engine.language_host import main

if __name__ == "__main__":
    sys.exit(main())
