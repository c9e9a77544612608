"""The privacy context (accountant, noise source, caps) and the user sampler of a run, and the rules that refuse an
accountant or composition that cannot account the learner's releases."""
from __future__ import annotations


from hydra.utils import get_class
from omegaconf import OmegaConf

from dppo.config import to_container
from dppo.data import OnePassUserSampler, PoissonUserSampler
from dppo.errors import ConfigError
from dppo.oracles.base import LeastSquaresOracle
from dppo.privacy import NoiseSource, PrivacyContext
from dppo.privacy.accountants import make_accountant
from dppo.privacy.correlated import CORRELATIONS, CorrelatedNoise

WORKLOADS = ("auto", "prefix", "momentum")   # privacy.noise_workload


def build_privacy(cfg, cls) -> PrivacyContext:
    p = cfg.privacy
    name = p.accountant
    if p.multi_pass and cfg.eps is not None and _releases_pure_dp(cfg, cls):
        raise ConfigError(f"privacy.multi_pass=true: Opacus' RDP/PRV accounting composes Poisson-subsampled "
                          f"Gaussian releases, and {cls.__name__} makes pure-DP releases; use one-pass training")
    if name is None:
        name = _default_accountant(cls, cfg)
    if p.multi_pass and name not in ("rdp", "prv"):
        raise ConfigError("privacy.multi_pass=true needs privacy.accountant=rdp or prv (users are reused)")
    check_accountant(cfg, cls, name)
    context = PrivacyContext(cfg.eps, cfg.delta, accountant=make_accountant(name),
                             noise=NoiseSource(cfg.seed, secure=p.secure_rng), max_epsilon=p.max_epsilon,
                             multi_pass=p.multi_pass, population_size=p.population_size)
    if p.noise_correlation != "none" and cfg.eps is not None:
        context.noise_correlation = correlated_noise(cfg, cls)
    return context


def correlated_noise(cfg, cls) -> CorrelatedNoise:
    """``privacy.noise_correlation``: the option of DP-PG's and DP-PPO's Gaussian sums (``dppo.privacy.correlated``).
    ``privacy.noise_workload`` says what its factorization is optimized for: ``auto`` the learner's SGD momentum
    when it steps with SGD and momentum, prefix sums otherwise; ``prefix`` prefix sums (plain SGD) whatever the
    optimizer; ``momentum`` the learner's SGD momentum (refused without one). Utility only: the guarantee does not
    depend on it."""
    p = cfg.privacy
    if p.noise_correlation not in CORRELATIONS:
        raise ConfigError(f"privacy.noise_correlation must be one of {', '.join(CORRELATIONS)}, got "
                          f"{p.noise_correlation!r}")
    if not {"dp_pg", "dp_ppo"} & set(cls.names):
        raise ConfigError(f"privacy.noise_correlation applies to algo=dp_pg and algo=dp_ppo; {cls.__name__} releases "
                          f"otherwise: set privacy.noise_correlation=none")
    algo, defaults = to_container(cfg.algo), cls.defaults()
    value = lambda k: algo.get(k, defaults.get(k))  # noqa: E731
    sgd_momentum = float(value("momentum") or 0.0) if value("optimizer") == "sgd" else 0.0
    workload = p.noise_workload
    if workload not in WORKLOADS:
        raise ConfigError(f"privacy.noise_workload must be one of {', '.join(WORKLOADS)}, got {workload!r}")
    if workload == "momentum" and sgd_momentum == 0.0:
        raise ConfigError("privacy.noise_workload=momentum needs a learner stepping with SGD and momentum "
                          "(algo.optimizer=sgd, algo.momentum > 0); use noise_workload=prefix or auto")
    momentum = 0.0 if workload == "prefix" else sgd_momentum
    rounds = OmegaConf.select(cfg, "rounds", default=None)
    return CorrelatedNoise(p.noise_correlation, int(p.bands), momentum=momentum,
                           rounds=None if rounds is None else int(rounds))


def _default_accountant(cls, cfg) -> str:
    """The learner's own accountant choice (``Learner.accountant_name``: parallel / rdp unless it says otherwise)."""
    return cls.accountant_name(cfg.privacy, to_container(cfg.algo))


def check_accountant(cfg, cls, name: str) -> None:
    """Refuse, before round 0, an accountant or composition that cannot account this learner's releases."""
    if cfg.eps is None:
        return
    p = cfg.privacy
    if name in ("rdp", "prv") and not p.multi_pass:
        raise ConfigError(f"privacy.accountant={name} composes Poisson-subsampled rounds and needs "
                          f"privacy.multi_pass=true with privacy.population_size; one-pass runs use parallel "
                          f"(the default) or basic")
    pure = _releases_pure_dp(cfg, cls)
    if p.multi_pass and pure:
        raise ConfigError(f"privacy.multi_pass=true: Opacus' RDP/PRV accounting composes Poisson-subsampled "
                          f"Gaussian releases, and {cls.__name__} makes pure-DP releases; use one-pass training")
    carries_rho = bool(cls.releases_carry_rho(cfg))   # Gaussian releases with their zCDP rho
    if name in ("advanced", "zcdp") and not pure and not (name == "zcdp" and carries_rho):
        raise ConfigError(f"privacy.accountant={name} composes pure-DP (delta=0) releases only, and "
                          f"{cls.__name__} makes (eps, delta) Gaussian releases; use privacy.accountant=parallel "
                          f"(one-pass default) or basic")
    if name == "gdp" and (pure or not carries_rho):
        raise ConfigError(f"privacy.accountant=gdp composes the Gaussian continual counters' releases only, and "
                          f"{cls.__name__} (with this config) makes other releases; use privacy.accountant=null "
                          f"(the learner's default)")
    uses_composition = cls.uses_composition
    # privacy.composition: the deprecated name of GFA's privacy.accountant ('advanced', its old default, in the
    # configs of runs saved before, is GFA's default and means nothing to another learner)
    legacy = p.composition if p.composition not in (None, "advanced") else None
    if uses_composition and p.accountant is not None and legacy is not None and p.accountant != legacy:
        raise ConfigError(f"privacy.accountant={p.accountant} contradicts the deprecated privacy.composition="
                          f"{legacy}; set privacy.accountant only")
    if legacy is not None and not uses_composition:
        raise ConfigError(f"privacy.composition={legacy} (deprecated: privacy.accountant) applies to the GFA "
                          f"learners only; {cls.__name__} is accounted by privacy.accountant")
    # one-pass rounds (and PUCB's counters) each spend the whole eps at once; multi-pass rounds and GFA's
    # composed releases spend a share of it, so a lower cap there just stops the run early
    if p.max_epsilon is not None and p.max_epsilon < cfg.eps and not p.multi_pass and not uses_composition:
        raise ConfigError(f"privacy.max_epsilon={p.max_epsilon} is below eps={cfg.eps}: the run would stop "
                          f"before its first full round; raise privacy.max_epsilon or lower eps")
    if p.max_epsilon is not None and p.multi_pass and p.population_size and name in ("rdp", "prv"):
        from dppo.privacy.accountants.opacus import multi_pass_first_release_epsilon

        first = multi_pass_first_release_epsilon(cfg.eps, cfg.delta, cfg.users_per_round / p.population_size,
                                                 cfg.rounds, name)
        if first > p.max_epsilon:
            raise ConfigError(f"privacy.max_epsilon={p.max_epsilon} is below the {first:.4g} that the first "
                              f"multi-pass round spends (eps={cfg.eps} over {cfg.rounds} rounds): the run would "
                              f"stop before round 0; raise privacy.max_epsilon")


def _releases_pure_dp(cfg, cls) -> bool:
    """Whether every release of the learner is pure eps-DP (delta = 0): a learner says so itself
    (``Learner.releases_pure_dp``); an oracle-based learner's releases are its oracle's, which declares it
    (``LeastSquaresOracle.pure_dp``: the exponential-mechanism oracle's; a target that is no oracle is refused
    when it is built)."""
    if "oracle" in cls.needs and cfg.oracle is not None:
        oracle = get_class(cfg.oracle._target_)
        return issubclass(oracle, LeastSquaresOracle) and oracle.pure_dp
    return bool(cls.releases_pure_dp(cfg))


def build_sampler(cfg, noise=None):
    p = cfg.privacy
    if p.multi_pass:
        return PoissonUserSampler(cfg.users_per_round, p.population_size, seed=cfg.seed, noise=noise)
    sampler = OnePassUserSampler(cfg.users_per_round, p.population_size, seed=cfg.seed)
    return sampler
