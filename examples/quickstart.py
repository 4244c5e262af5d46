"""Quickstart: a real 2-node pool on the Local provider.

Provisions one Pulumi stack (two nodes, each a real sshd on its own loopback address), runs
functions on the nodes over SSH, prints the results, and destroys the stack on exit.
"""

import skyward_iac as sky


@sky.function
def hello(x: int) -> str:
    import os
    import socket

    return f"{socket.gethostname()} (pid {os.getpid()}) got {x}"

@sky.function
def square(x: int) -> int:
    return x * x

if __name__ == "__main__":
    with sky.Compute(provider=sky.Local(), nodes=2) as pool:
        print(hello(21) >> pool)
        print(hello(22) >> pool)
        print("broadcast:", square(7) @ pool)
        print("squares:", [square(i) >> pool for i in range(5)])
