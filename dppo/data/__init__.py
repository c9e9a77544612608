"""User streams and user-level batch samplers."""
from dppo.data.sampler import OnePassUserSampler, PoissonUserSampler, UserSampler

__all__ = ["OnePassUserSampler", "PoissonUserSampler", "UserSampler"]
