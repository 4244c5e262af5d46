"""The Pulumi engine's plumbing: finding it, running its commands, its hosts, plugins and state files."""
