"""dppo command line: `python train.py algo=dp_pg eps=5` (Hydra). Bad input: one line on stderr, exit 2."""
from __future__ import annotations

import sys

try:
    import hydra
    from hydra.core.hydra_config import HydraConfig

    from dppo.cli import entry, run_from_hydra
    from dppo.config import register_schema
except KeyboardInterrupt:   # Ctrl-C while importing: nothing started, nothing to say beyond that
    print("\ndppo: interrupted before round 0: no user was drawn", file=sys.stderr)
    sys.exit(130)

register_schema()


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg) -> None:
    run_from_hydra(cfg, HydraConfig.get().runtime.output_dir, multirun=HydraConfig.get().mode.name == "MULTIRUN")


if __name__ == "__main__":
    entry(main, sys.argv[1:])
