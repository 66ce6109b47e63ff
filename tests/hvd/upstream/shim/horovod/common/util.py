"""``horovod.common.util``: the version comparison the Keras tests import, as Horovod's."""

from packaging import version


def is_version_greater_equal_than(ver: str, target: str) -> bool:
    if not (isinstance(ver, str) and isinstance(target, str)):
        raise ValueError(f"This function only accepts string arguments; got {ver!r}, {target!r}")
    return version.parse(ver) >= version.parse(target)
