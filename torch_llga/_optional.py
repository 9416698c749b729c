"""The tools' optional packages (models from torchvision and transformers, the bench's chart and its
other runtimes): the library needs none of them, and a tool names what to install when one is missing."""
import importlib.util

import torch


def installed(package):
    return importlib.util.find_spec(package) is not None


def install_command(package):
    if package == "torchvision":
        # Each torchvision release requires one torch release: pinned to this one, pip picks the
        # torchvision built for it instead of replacing torch.
        return f'pip install torchvision "torch=={torch.__version__.split("+")[0]}"'
    return f"pip install {package}"


def missing(what, package):
    """One sentence: `what` needs `package`, which is not installed, and the command that installs it."""
    return f"{what} needs {package}, which is not installed: {install_command(package)}"


def not_installed(package):
    return f"{package} is not installed ({install_command(package)})"
