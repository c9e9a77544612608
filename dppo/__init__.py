"""dppo: differentially private policy optimization (DP-PG, DP-NPG, DP-REBEL, PUCB, DP-GFA)."""
from dppo.api import load_run_config, make_config, train
from dppo.saved_run import SavedRun, load

__all__ = ["train", "make_config", "load_run_config", "load", "SavedRun"]
__version__ = "0.1.0"
