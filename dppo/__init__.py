"""dppo: differentially private policy optimization (DP-PG, DP-NPG, DP-REBEL, PUCB, DP-GFA)."""
from dppo.api import load_run_config, make_config, train

__all__ = ["train", "make_config", "load_run_config"]
__version__ = "0.1.0"
