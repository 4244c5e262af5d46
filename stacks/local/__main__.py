"""The stack skyward_iac creates for `sky.Compute(provider=sky.Local(), ...)`, as a Pulumi project.

Every `skyward:*` key of the stack's config is a Spec field (see Pulumi.example.yaml and
stacks/README.md); the resources come from the package's own stack program, unchanged.
"""

import pulumi

from skyward_iac.infra.programs import program_for
from skyward_iac.infra.stacks.config import cluster_request, read_pulumi_config

# Named after project and stack, so two projects' stacks called "dev" never share a name.
request = cluster_request("local", read_pulumi_config(),
                          stack_name=f"{pulumi.get_project()}-{pulumi.get_stack()}")
program_for(request)()
