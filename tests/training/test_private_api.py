"""The launcher's private Lightning and torch names (lowcomm.training.lightning.private_api) against the releases they
were written for."""

from importlib.metadata import version

import pytest

from lowcomm.training.lightning import private_api


@pytest.mark.parametrize("package", sorted(private_api.WRITTEN_FOR))
def test_the_installed_release_is_the_one_the_private_names_were_written_for(package):
    installed, written_for = version(package).split("+")[0], private_api.WRITTEN_FOR[package]
    assert installed == written_for, (
        f"{package} {installed} is installed, but lowcomm/training/lightning/private_api.py was written for "
        f"{written_for}: check that each of its names still exists and behaves as the launcher expects (the "
        "launcher's and the fault tests), then update WRITTEN_FOR")


def test_every_private_name_is_there():
    assert all(callable(getattr(private_api, name)) for name in private_api.__all__ if name != "WRITTEN_FOR")
