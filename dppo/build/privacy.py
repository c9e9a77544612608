"""The privacy context (accountant, noise source, caps) and the user sampler of a run, and the rules that refuse an
accountant or composition that cannot account the learner's releases."""
from __future__ import annotations


from hydra.utils import get_class
from omegaconf import OmegaConf

from dppo.config import to_container
from dppo.data import OnePassUserSampler, PoissonUserSampler
from dppo.errors import ConfigError
from dppo.oracles import ORACLES
from dppo.oracles.base import LeastSquaresOracle
from dppo.privacy import Ledger, NoiseSource, PrivacyContext
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
    correlation = correlated_noise(cfg, cls) if p.noise_correlation != "none" and cfg.eps is not None else None
    return PrivacyContext(cfg.eps, cfg.delta, accountant=make_accountant(name),
                          noise=NoiseSource(cfg.seed, secure=p.secure_rng), max_epsilon=p.max_epsilon,
                          multi_pass=p.multi_pass, population_size=p.population_size, noise_correlation=correlation)


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
    if not _releases_gaussian_sums(cfg, cls):
        raise ConfigError(f"privacy.noise_correlation applies to the releases of clipped Gaussian sums (algo=dp_pg, "
                          f"dp_ppo, and dp_npg / dp_rebel with oracle=dp_gd); {cls.__name__} with this config releases "
                          f"otherwise: set privacy.noise_correlation=none (or oracle=dp_gd)")
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


def _releases_gaussian_sums(cfg, cls) -> bool:
    """Whether the learner's private releases are rounds of the one release of clipped Gaussian sums
    (``dppo.privacy.composed``), which correlated noise is an option of: a learner says so itself
    (``Learner.releases_gaussian_sums``); an oracle-based learner's releases are its oracle's (the one named, or
    the family's default private oracle), which declares it (``LeastSquaresOracle.gaussian_sums``: dp_gd's)."""
    if "oracle" in cls.needs:
        target = cfg.oracle._target_ if cfg.oracle is not None else ORACLES[cls.default_oracle(True, 1)]
        oracle = get_class(target) if isinstance(target, str) else target
        return isinstance(oracle, type) and issubclass(oracle, LeastSquaresOracle) and oracle.gaussian_sums
    return bool(cls.releases_gaussian_sums(cfg))


def check_passed_privacy(cfg, cls, privacy) -> None:
    """A privacy context handed in (``dppo.train(privacy=...)``) is checked against the context the config builds,
    so that the run's guarantee is the one its config (``.hydra``) records and its accountant can account: the
    same class, (eps, delta), adjacency (multi-pass and population), cap, accountant, correlated noise and noise
    source kind, and nothing released or admitted yet (a resume loads the run's own state into it)."""
    hint = "or leave privacy= out (the config builds it)"
    if type(privacy) is not PrivacyContext:
        raise ConfigError(f"privacy= takes a dppo.privacy.PrivacyContext, got a {type(privacy).__name__}; {hint}")
    ref = build_privacy(cfg, cls)
    p = cfg.privacy
    rows = [("eps", privacy.eps, ref.eps), ("delta", privacy.delta, ref.delta),
            ("privacy.multi_pass", privacy.multi_pass, ref.multi_pass),
            ("privacy.max_epsilon", privacy.max_epsilon, ref.max_epsilon),
            ("privacy.accountant", type(privacy.accountant).__name__, type(ref.accountant).__name__),
            ("privacy.noise_correlation", privacy.noise_correlation, ref.noise_correlation),
            ("privacy.secure_rng", type(privacy.noise) is NoiseSource and privacy.noise.secure, ref.noise.secure)]
    if p.multi_pass:
        rows.append(("privacy.population_size", privacy.population_size, ref.population_size))
    for key, given, expected in rows:
        if given != expected:
            raise ConfigError(f"privacy= runs {key}={given} but the config says {key}={expected}: the run would "
                              f"record a guarantee it does not run; set {key} in the config to match, {hint}")
    if type(privacy.noise) is not NoiseSource or type(privacy.ledger) is not Ledger:
        raise ConfigError(f"privacy= must draw from a dppo.privacy.NoiseSource and record in a dppo.privacy.Ledger; "
                          f"{hint}")
    if not privacy.check_users:
        raise ConfigError(f"privacy= was made with check_users=False (an audit's context), which lets a user into "
                          f"two rounds; {hint}")
    if privacy.ledger.entries or len(privacy.users) or privacy.spent()[0] > 0:
        raise ConfigError(f"privacy= has already released or admitted users; pass a fresh PrivacyContext (resume "
                          f"loads the run's own state), {hint}")


def check_passed_sampler(cfg, sampler, privacy) -> None:
    """A sampler handed in (``dppo.train(sampler=...)``) is checked against the config before round 0: the same
    one-pass / multi-pass choice and round size; a multi-pass run's accountant counts on amplification by Poisson
    sampling at rate users_per_round / population_size, so there it must be dppo's own ``PoissonUserSampler`` at
    that rate, with secret coins when the noise is secret. (Every take of a one-pass sampler is checked by the
    run's ``UserGate``: ``dppo.privacy.users``.)"""
    p = cfg.privacy
    hint = "or leave sampler= out (the config builds it)"
    if bool(sampler.multi_pass) != bool(p.multi_pass):
        raise ConfigError(f"sampler= is {'multi' if sampler.multi_pass else 'one'}-pass but the config says "
                          f"privacy.multi_pass={p.multi_pass}; set privacy.multi_pass to match, {hint}")
    if int(sampler.users_per_round) != int(cfg.users_per_round):
        raise ConfigError(f"sampler= draws {sampler.users_per_round} users per round but the config says "
                          f"users_per_round={cfg.users_per_round}; set users_per_round to match, {hint}")
    if not p.multi_pass:
        return
    if type(sampler) is not PoissonUserSampler or sampler.population_size != p.population_size or \
            sampler.sample_rate != cfg.users_per_round / p.population_size:
        raise ConfigError(f"a multi-pass run's accountant counts on dppo.data.PoissonUserSampler at rate "
                          f"users_per_round / privacy.population_size = {cfg.users_per_round}/{p.population_size}; "
                          f"sampler= is not that, {hint}")
    if privacy.noise.secure and sampler.noise is None:
        raise ConfigError(f"sampler= draws its Poisson coins from a seeded generator while the noise is secret "
                          f"(amplification by sampling needs secret coins): make it with noise=<the run's "
                          f"NoiseSource>, {hint}")


def build_sampler(cfg, noise=None):
    p = cfg.privacy
    if p.multi_pass:
        return PoissonUserSampler(cfg.users_per_round, p.population_size, seed=cfg.seed, noise=noise)
    sampler = OnePassUserSampler(cfg.users_per_round, p.population_size, seed=cfg.seed)
    return sampler
