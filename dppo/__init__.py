"""dppo: differentially private policy optimization (DP-PG, DP-NPG, DP-REBEL, PUCB, DP-GFA)."""
from dppo.api import load_run_config, make_config, train
from dppo.privacy.engine import make_private
from dppo.saved_run import SavedRun, load

__all__ = ["train", "make_config", "load_run_config", "load", "SavedRun", "make_private"]
__version__ = "0.1.0"
