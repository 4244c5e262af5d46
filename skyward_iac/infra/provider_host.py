"""The stable ``python -m`` name the installed dynamic-provider launcher execs (tools/pulumi/):
the provider host itself is infra/engine/provider_host.py."""

import sys

from skyward_iac.infra.engine.provider_host import main

if __name__ == "__main__":
    sys.exit(main())
