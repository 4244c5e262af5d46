"""Container images: run a pool's agent inside a Docker image.

On AWS and GCP, ``container_image=`` makes each node install Docker (and the NVIDIA container
toolkit on GPU nodes) when missing, pull the image and run the bootstrap and agent inside it,
with the host's network and the node's GPUs::

    sky.Compute(provider=sky.AWS(container_image=sky.containers.pytorch("2.8")),
                accelerator=sky.accelerators.A100(), nodes=2)

Local installs and pulls nothing: it runs the image only when a Docker engine answers here and
the image is present (``docker pull ubuntu:24.04``); otherwise it says why before anything is
provisioned, which is what this script shows on a machine without Docker.
"""

import skyward_iac as sky


@sky.function
def os_release() -> str:
    with open("/etc/os-release") as release:
        return next(line for line in release if line.startswith("PRETTY_NAME")).strip()


if __name__ == "__main__":
    print("cuda image:", sky.containers.cuda("12.8"))
    print("NGC PyTorch image:", sky.containers.pytorch("2.8"))
    print("any image:", sky.DockerImage.of("ghcr.io/acme/train:1.4", cuda="12.8"))
    try:
        with sky.Compute(provider=sky.Local(container_image=sky.containers.ubuntu("24.04")),
                         options=sky.Options(console="silent")) as pool:
            print("inside the container:", os_release() >> pool)
    except sky.ConfigError as refused:
        print("Local refused the image:", refused)
