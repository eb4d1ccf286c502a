"""The config of a `python -m harness` job, Hydra's own part included (Hydra's compose API on conf/)."""

from hydra import compose, initialize_config_dir

from tests.conftest import ROOT


def compose_job(overrides: list[str]):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=overrides, return_hydra_config=True)
