"""Configuration as data: nested keyword-only dataclasses, TOML files and `--set a.b=c` overrides.

Every field carries a help text (shown by `lowband config`) and is validated when the dataclass
is built, with a message naming the field, the value and what is allowed. The `[method]` table
holds the method's name and its own options; each method defines that table's dataclass.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, Literal

import tomli_w
import tomllib

from lowband.errors import ConfigError, require
from lowband.net.links import LINK_WORDS, parse_link
from lowband.net.sites import site_map

MAX_SEED = 2**32 - 1  # numpy's seeds
MAX_WORKERS = 1024  # worker processes on one machine: each needs memory, a port and a process
MAX_TIMEOUT_S = 7 * 24 * 3600.0
MAX_LR = 1e3
MAX_EPOCHS = 1_000_000
MAX_STEPS = 10**12  # a loop's optimizer steps (lowband.wrap's total_steps)
MAX_SAMPLES = 1_000_000  # MNIST-1D is generated on the machine (about 2,000 samples a second on one core)
MAX_THREADS = 1024  # and at most this machine's cores (check_threads, below)
GptSize = Literal["nano", "tiny", "small", "medium", "large"]  # their shapes: lowband.models.gpt.SIZES


TEXT = "text"  # data.name of the built-in corpus; "text:PATH" names a UTF-8 file or directory (lowband.data.text)


def machine_cores() -> int:
    """The cores this process may run on (its CPU affinity where the system says it)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def check_threads(threads: int, field: str) -> None:
    """Refuse more torch threads a process than this machine has cores, before any process starts them (past
    the cores they only slow it; by the thousand a worker fails to start its thread pool)."""
    if threads > (cores := machine_cores()):
        raise ConfigError(field, threads, f"must be <= {cores}, this machine's cores")


def is_text_data(name: str) -> bool:
    """Whether `data.name` names byte-level text (a language model's corpus), not a classification set:
    the one place that decides it."""
    return name == TEXT or name.startswith(TEXT + ":")


def text_path(name: str) -> str | None:
    """The PATH of a `text:PATH` data name; None for the built-in corpus (`text`)."""
    return None if name == TEXT else name.removeprefix(TEXT + ":")


@dataclass(frozen=True)
class Bounds:
    """The values a number field allows, as its declaration says them: ">= 1", "> 0", "[0, 1)", "(0, 1e3]",
    "0..N" (integers); `also` values allowed besides (a sentinel such as -1), `note` said after the range."""

    spec: str
    note: str = ""
    also: tuple = ()

    def _interval(self) -> tuple[float, float, bool, bool]:
        """(low, high, low included, high included)."""
        s = self.spec.strip()
        for op, incl in ((">=", True), (">", False)):
            if s.startswith(op):
                return float(s[len(op):]), math.inf, incl, False
        for op, incl in (("<=", True), ("<", False)):
            if s.startswith(op):
                return -math.inf, float(s[len(op):]), False, incl
        if ".." in s:
            lo, hi = s.split("..")
            return float(lo), float(hi), True, True
        lo, hi = s[1:-1].split(",")
        return float(lo), float(hi), s[0] == "[", s[-1] == "]"

    def holds(self, value) -> bool:
        if value in self.also:
            return True
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            return False
        lo, hi, lo_in, hi_in = self._interval()
        return (lo < value or (lo_in and lo == value)) and (value < hi or (hi_in and hi == value))

    def says(self, integer: bool = False) -> str:
        """'must be in [0, 1)', "must be 'auto' or >= 0", 'must be an integer >= 1', as an error message says it."""
        s = self.spec.strip()
        return f"must be {self._words()}{'an integer ' if integer else ''}{s if s[0] in '<>' else 'in ' + s}{self.note}"

    def allowed(self) -> str:
        """'[0, 1)', "'auto' or >= 1", with the note: as a help text says it."""
        return self._words() + self.spec.strip() + self.note

    def _words(self) -> str:
        """The words allowed besides the range ('auto'), each followed by ' or '."""
        return "".join(f"{a!r} or " for a in self.also if isinstance(a, str))


@dataclass(frozen=True)
class Form:
    """The text a string field allows: `pattern`, a regular expression the whole value matches, or `parse`, a
    grammar of its own that raises ConfigError naming the field (a codec spec). `words` say what is allowed
    ("empty or a redis:// URL"), `note` why, as an error message ("must be WORDS NOTE") and a help text say it."""

    words: str
    pattern: str = ""
    parse: Callable[[str, str], object] | None = None
    note: str = ""

    def check(self, value, field: str) -> None:
        if self.parse is not None:
            self.parse(value, field)
        elif not (isinstance(value, str) and re.fullmatch(self.pattern, value)):
            raise ConfigError(field, value, f"must be {self.allowed()}")

    def allowed(self) -> str:
        return self.words + self.note


def opt(default, help: str, bounds: str = "", note: str = "", also: tuple = (), name: str = "",
        form: Form | None = None, only: tuple[str, object, str] | None = None):
    """A dataclass field with a default, a help text and what it allows, checked when its table is built
    with one message naming the field, the value and what is allowed: for a number its `Bounds`, for text
    its `form` (a list: each item's). `name`: what the user calls it where that is not SECTION.KEY (a
    command-line flag such as --tune-epochs); `note` is said after the range, or after a Literal's choices.
    `only=(FIELD, VALUE, WHY)`: any value but the default needs the table's FIELD to be VALUE."""
    rule = Bounds(bounds, note, also) if bounds else form
    meta = {"help": help, **({"bounds": rule} if rule else {}), **({"name": name} if name else {}),
            **({"note": note} if note and not bounds else {}), **({"only": only} if only else {})}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """The field types of dataclass `cls` ({} when one is only imported for type checking: nothing to check)."""
    try:
        return typing.get_type_hints(cls)
    except NameError:
        return {}


def _choices(cls: type) -> dict[str, tuple]:
    """The fields of dataclass `cls` typed as a Literal, and the values each allows."""
    return {name: typing.get_args(tp) for name, tp in _hints(cls).items() if typing.get_origin(tp) is Literal}


def _integers(cls: type) -> frozenset[str]:
    """The fields of dataclass `cls` typed int, int | None or list[int]."""
    return frozenset(name for name, tp in _hints(cls).items() if tp in (int, list[int]) or (
        typing.get_origin(tp) in (typing.Union, types.UnionType) and set(typing.get_args(tp)) == {int, type(None)}))


@functools.cache
def bounds_of(cls: type) -> dict[str, Bounds | Form]:
    """Each bounded field of dataclass `cls`, with its bounds: a field a subclass declares again (a new
    default) keeps the bounds its base declared unless it declares its own."""
    found: dict[str, Bounds | Form] = {}
    for base in reversed(cls.__mro__):
        for name, f in getattr(base, "__dataclass_fields__", {}).items():
            if "bounds" in f.metadata:
                found[name] = f.metadata["bounds"]
    return found


def check_bounds(table, prefix: str) -> None:
    """Raise ConfigError for the first field of `table` (a dataclass) outside its declared type (an integer
    field), bounds, form or choices; a list's rule holds for each of its items."""
    choices, rules, ints = _choices(type(table)), bounds_of(type(table)), _integers(type(table))  # type: ignore[arg-type]
    for f in fields(table):
        value, name = getattr(table, f.name), f.metadata.get("name") or f"{prefix}.{f.name}"
        for item in value if isinstance(value, list) else [value]:
            _check(item, name, rules.get(f.name), f.name in ints)
        if f.name in choices and value not in choices[f.name]:
            raise ConfigError(name, value, "must be one of " + ", ".join(map(repr, choices[f.name])) +
                              f.metadata.get("note", ""))
    for f in fields(table):  # then the rules between fields, each field's own value known good
        other, wanted, why = f.metadata.get("only", ("", None, ""))
        if other and getattr(table, f.name) != f.default and getattr(table, other) != wanted:
            raise ConfigError(f"{prefix}.{f.name}", getattr(table, f.name), f"applies with {prefix}.{other}="
                                                                           f"{wanted!r} only, not {getattr(table, other)!r}{why}")


def _check(value, name: str, rule: Bounds | Form | None, integer: bool) -> None:
    """One value against its field's rule, and whole when the field takes integers."""
    whole = not integer or value is None or (isinstance(value, int) and not isinstance(value, bool))
    if isinstance(rule, Form):
        rule.check(value, name)
    elif rule is not None and not (whole and rule.holds(value)):
        raise ConfigError(name, value, rule.says(integer=not whole))
    if not whole:
        raise ConfigError(name, value, "must be an integer")


@dataclass(kw_only=True)
class TrainConfig:
    workers: int = opt(4, "worker processes K (ignored under torchrun, which sets the world size)", bounds=f"1..{MAX_WORKERS}")
    epochs: int = opt(30, "passes over each worker's data", bounds=f"1..{MAX_EPOCHS}")
    batch_size: int = opt(32, "minibatch size per worker", bounds=">= 1")
    seed: int = opt(0, "seed for model initialisation, data partition and data order", bounds=f"0..{MAX_SEED}")
    eval_every: int = opt(1, "evaluate on the test set every this many epochs", bounds=f"1..{MAX_EPOCHS}")
    eval_batch_size: int = opt(1000, "batch size for evaluation", bounds="1..1000000")
    eval_ranks: int = opt(8, "past this many workers, each evaluated epoch only rank 0, the rank with the lowest "
                             "training loss and this many evenly spaced ranks evaluate their own model (the others' "
                             "per-rank figures are null; the global model is evaluated as always); 0: every rank",
                          bounds=f"0..{MAX_WORKERS}", note=" (0: every rank)")
    checkpoint_every: int = opt(1, "write a resumable checkpoint every this many epochs",
                                bounds=f"0..{MAX_EPOCHS}", note=" (0: only at the end)")
    max_restarts: int = opt(0, "when a worker dies, restart all from the latest checkpoint, at most this many times",
                            bounds="0..1000")
    device: Literal["auto", "cpu", "cuda"] = opt("auto", "auto: cuda when available, else cpu; local worker r "
                                                         "trains on GPU r % the GPUs")
    backend: Literal["auto", "gloo", "nccl"] = opt("auto", "auto: nccl when every worker on a machine has a GPU of "
                                                           "its own, else gloo (workers sharing a GPU, or the CPU)")
    precision: Literal["fp32", "bf16"] = opt("fp32", "bf16: each step's forward pass under torch.autocast in "
                                                     "bfloat16 (CPU and CUDA); weights, gradients, optimizer and "
                                                     "outer state stay fp32, the loss is taken in fp32, and what "
                                                     "travels is the codec's, as in fp32. For GPUs: a CPU without "
                                                     "native bfloat16 is slower in it (7.7x on the 2-core EPYC, "
                                                     "BENCHMARKS.md)")
    timeout_s: float = opt(300.0, "process-group timeout: a collective waiting longer fails",
                           bounds=f"(0, {MAX_TIMEOUT_S:g}]", note=" seconds")
    threads: int = opt(1, "torch threads per worker process (at most this machine's cores)", bounds=f"1..{MAX_THREADS}")
    target_accuracy: float = opt(0.0, "report the first epoch whose validation accuracy reaches this (0: none)", bounds="[0, 1]")
    target_bpb: float = opt(0.0, "language models: report the first epoch whose validation bits per byte is within "
                                 "1% of this (0: none)", bounds=">= 0", note=" (0: none)")
    stop_at_target: bool = opt(False, "stop training at the first epoch that reaches target_accuracy (target_bpb)")
    loggers: list[str] = opt([], "experiment loggers mirroring every epoch's figures (wandb: offline unless "
                                 "WANDB_MODE is set)",
                             form=Form("tensorboard, wandb or package.module:factory", r"tensorboard|wandb|\S+:\S+"))

    def __post_init__(self):
        check_bounds(self, "train")
        require(not self.stop_at_target or self.target_accuracy > 0 or self.target_bpb > 0, "train.stop_at_target",
                self.stop_at_target, "needs train.target_accuracy > 0, train.target_bpb > 0 or --target-from RUN_DIR")


@dataclass(kw_only=True)
class DataConfig:
    name: str = opt("mnist1d", "data set: mnist1d, mnist5k, digits, cifar10, cifar100, imagefolder, "
                                     "package.module:factory or PATH.npz (your own; see lowband.data.custom), "
                                     "text (the King James Bible as bytes) or text:PATH (a UTF-8 file or directory)")
    root: str = opt("", "directory holding cifar10/cifar100/imagefolder data")
    num_samples: int = opt(5000, "mnist1d: samples generated (80% train, 20% test)", bounds=f"50..{MAX_SAMPLES}",
                           note=" (generated on this machine, about 2,000 a second)")
    partition: Literal["iid", "dirichlet", "same"] = opt(
        "iid", "iid: disjoint random shards; dirichlet: non-IID label skew; same: every worker all data")
    alpha: float = opt(0.5, "dirichlet concentration: small is more skewed", bounds="> 0")
    augment: Literal["auto", "on", "off"] = opt("auto", "random crop + flip; auto: on for cifar/imagefolder")
    image_size: int = opt(32, "imagefolder: images are resized to this square size", bounds="8..1024")
    cache_dir: str = opt("", "where generated data sets are cached (default ~/.cache/lowband)")
    val_fraction: float = opt(0.1, "share of the training data held out for validation (stratified, never trained "
                                   "on); model selection, targets and early stopping read it, never the test set; "
                                   "text: the share of the corpus in each of the validation and test blocks", bounds="(0, 0.5]")
    val_seed: int = opt(0, "seed of the validation split (the same for every method and train.seed)", bounds=f"0..{MAX_SEED}")
    context: int = opt(128, "text: bytes per training window (the model's context)", bounds=">= 2")
    max_bytes: int = opt(0, "text: use only the corpus's first this many bytes (0: all of it)",
                         bounds=">= 0", note=" (0: the whole corpus)")

    def __post_init__(self):
        check_bounds(self, "data")
        require(not self.is_text or self.partition != "dirichlet", "data.partition", self.partition,
                "text data has no class labels to skew; use 'iid' or 'same'")

    @property
    def is_text(self) -> bool:
        """`text` or `text:PATH`: a byte-level corpus (lowband.data.text), not a classification set."""
        return is_text_data(self.name)


@dataclass(kw_only=True)
class ModelConfig:
    name: str = opt("cnn1d", "mlp, cnn1d, cnn2d, resnet20, resnet32, vgg16, nin, cnn13, gpt (text data), "
                             "or package.module:factory")
    hidden: int = opt(256, "mlp: hidden width", bounds="1..65536")
    channels: int = opt(25, "cnn1d: channels of each convolution (25 in the MNIST-1D paper; wider makes a teacher)",
                        bounds="1..4096")
    size: GptSize = opt("tiny", "gpt: named size (parameters at vocabulary 256, context 128): nano 2 layers x 24 "
                                "(23,712), tiny 4 x 64 (224,640), small 4 x 128 (842,496), medium 6 x 192 "
                                "(2,743,296), large 10 x 512 (31,721,472)")
    n_layer: int = opt(0, "gpt: transformer blocks (0: from model.size)", bounds="0..256", note=" (0: the default, see its help)")
    n_head: int = opt(0, "gpt: attention heads, must divide model.n_embd (0: from model.size)",
                      bounds="0..1024", note=" (0: the default, see its help)")
    n_embd: int = opt(0, "gpt: embedding width (0: from model.size)", bounds="0..65536", note=" (0: the default, see its help)")
    context: int = opt(0, "gpt: longest input in tokens, the position table's length (0: the data's window, "
                          "data.context)", bounds="0..1048576", note=" (0: the default, see its help)")
    dropout: float = opt(0.0, "gpt: dropout probability after attention, MLP and embeddings", bounds="[0, 1)")
    kwargs: dict = opt({}, "package.module:factory models: keyword arguments for the factory, e.g. "
                           "--set model.kwargs.width=128 (a [model.kwargs] table in TOML)")

    def __post_init__(self):
        check_bounds(self, "model")
        require(not (self.n_embd and self.n_head) or self.n_embd % self.n_head == 0, "model.n_embd", self.n_embd,
                f"must be divisible by model.n_head={self.n_head}")
        require(not self.kwargs or ":" in self.name, "model.kwargs", self.kwargs,
                f"only a package.module:factory model takes keyword arguments; {self.name} has model.hidden "
                f"and model.channels")


@dataclass(kw_only=True)
class OptimConfig:
    name: Literal["sgd", "adam", "adamw"] = opt(
        "sgd", "optimizer; adamw (decoupled weight decay, betas 0.9/0.95, as GPT training uses) for the gpt model")
    lr: float = opt(0.05, "base learning rate (for one worker's batch)", bounds=f"(0, {MAX_LR:g}]")
    momentum: float = opt(0.9, "sgd momentum", bounds="[0, 1)")
    nesterov: bool = opt(False, "sgd: Nesterov momentum")
    weight_decay: float = opt(5e-4, "L2 weight decay", bounds="[0, 1]")
    schedule: Literal["constant", "step", "cosine"] = opt("cosine", "learning-rate schedule over the epochs")
    milestones: list[float] = opt([], "step schedule: epochs at which the rate is multiplied by gamma, in "
                                      "increasing order", bounds="> 0")
    gamma: float = opt(0.1, "step schedule: factor at each milestone", bounds="(0, 1]")
    warmup_epochs: float | str = opt("auto", "linear warm-up length in epochs; auto: the method's default",
                                     bounds=">= 0", also=("auto",))
    lr_scaling: Literal["linear", "none"] = opt(
        "linear", "linear: multiply lr by the method's data-parallel width (K for allreduce; Goyal et al.)")

    def __post_init__(self):
        check_bounds(self, "optim")
        require(self.milestones == sorted(self.milestones), "optim.milestones", self.milestones,
                "must be increasing epoch numbers")


LINK = Form(LINK_WORDS, parse=parse_link)


@dataclass(kw_only=True)
class LinkConfig:
    rate: str = opt("unlimited", "the link between sites (every worker its own site unless sites or site_of say "
                                 "otherwise)",
                    form=LINK)
    mode: Literal["model", "netns"] = opt("model", "model: delays in the communicator; netns: real tc-shaped links (root)")
    sites: int = opt(0, "S: the workers form S equal sites of consecutive ranks (0: every worker its own site)",
                     bounds=">= 0", note=" (0: every worker its own site)")
    site_of: list[int] = opt([], "each rank's site, for uneven sites, e.g. [0, 0, 0, 1] (overrides sites)",
                             bounds=">= 0", note=" (each rank's site)")
    intra: str = opt("unlimited", "the link inside a site (netns: RATE only)", form=LINK)

    def __post_init__(self):
        check_bounds(self, "link")

    def site_map(self, world: int) -> list[int]:
        """Each rank's site (lowband.net.sites); raises ConfigError for a map that does not fit `world`."""

        return site_map(self.sites, self.site_of, world)

    @property
    def intra_spec(self):

        return parse_link(self.intra)

    def site_count(self, world: int) -> int:
        """How many sites the config names (0: no site map, every worker its own site)."""
        return len(set(self.site_map(world))) if self.sites or self.site_of else 0

    @property
    def spec(self):

        return parse_link(self.rate)


@dataclass(kw_only=True)
class MethodConfig:
    """Base of every method's `[method]` table; each method subclasses it with its options."""

    name: str = opt("allreduce", "training method")

    def __post_init__(self):
        check_bounds(self, "method")


@dataclass(kw_only=True)
class ElasticConfig:
    on: bool = opt(False, "elastic membership (local_sgd, diloco, sparseloco): workers may leave and join (`lowband join RUN`) "
                          "while the job trains; they meet in a quorum at every outer step")
    min_workers: int = opt(1, "the fewest workers a round runs with; below it the job waits and says so",
                          bounds=f"1..{MAX_WORKERS}")
    max_workers: int = opt(0, "the most workers a round takes (0: no limit); more wait for a free place",
                           bounds=f"0..{MAX_WORKERS}", note=" (0: no limit)")
    coordinator: str = opt("", "Redis URL keeping membership (redis://HOST:PORT/DB); empty: an embedded one on "
                               "127.0.0.1, started by `lowband train`",
                           form=Form("empty or a redis://, rediss:// or unix:// URL", r"|(redis|rediss|unix)://.*"))
    host: str = opt("127.0.0.1", "address this machine's workers listen on for their quorum's process group")
    heartbeat_s: float = opt(1.0, "seconds between a worker's heartbeats", bounds=f"(0, {MAX_TIMEOUT_S:g}]", note=" seconds")
    dead_after_s: float = opt(5.0, "a worker silent this long is out of the job (it rejoins when it speaks again)",
                              bounds=f"(0, {MAX_TIMEOUT_S:g}]", note=" seconds")
    timeout_s: float = opt(30.0, "how long a quorum waits for a live worker to arrive, and a collective for a peer "
                                 "(then it fails and the round is redone without the silent worker); longer than "
                                 "an exchange takes on your link", bounds=f"(0, {MAX_TIMEOUT_S:g}]", note=" seconds")
    wait_s: float = opt(600.0, "how long a worker waits without progress (below min_workers, or for a coordinator "
                               "that is away) before it gives up (exit code 3)", bounds=f"(0, {MAX_TIMEOUT_S:g}]",
                        note=" seconds")
    scale_with_quorum: bool = opt(True, "a round with fewer workers than were launched takes a smaller step: "
                                        "DiLoCo's and SparseLoCo's outer step divides the pseudo-gradients' sum by "
                                        "the workers launched (an absent one counts as zero), local SGD's scaled rate "
                                        "counts the round's contributors (false: the mean over the contributors, at "
                                        "the launched rates)")
    max_failed_rounds: int = opt(5, "a round whose exchange fails this many times in a row for the same cause ends "
                                    "the job (or the joiner) with one line naming the cause, exit code 3; a joiner "
                                    "whose first exchange fails leaves at once", bounds="1..1000")

    def __post_init__(self):
        check_bounds(self, "elastic")
        require(self.max_workers == 0 or self.max_workers >= self.min_workers, "elastic.max_workers",
                self.max_workers, f"must be 0 (no limit) or >= elastic.min_workers={self.min_workers}")
        require(self.dead_after_s > self.heartbeat_s, "elastic.dead_after_s", self.dead_after_s,
                f"must be longer than elastic.heartbeat_s={self.heartbeat_s:g}")


@dataclass(kw_only=True)
class Config:
    method: MethodConfig
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    link: LinkConfig = dataclasses.field(default_factory=LinkConfig)
    elastic: ElasticConfig = dataclasses.field(default_factory=ElasticConfig)

    def __post_init__(self):
        """A target in the workload's own metric: accuracy for a classifier, bits per byte for text; one
        context is enough (`follow_context`)."""
        self.follow_context()
        text = self.data.is_text
        require(not (text and self.train.target_accuracy), "train.target_accuracy", self.train.target_accuracy,
                f"{self.data.name} trains a language model, judged in bits per byte: set train.target_bpb instead")
        require(not (not text and self.train.target_bpb), "train.target_bpb", self.train.target_bpb,
                f"{self.data.name} is classified, judged by accuracy: set train.target_accuracy instead")


    def follow_context(self) -> None:
        """A GPT's model.context given alone (data.context left at its default) sets the data's window too;
        model.context 0 takes data.context. Both given, model.context must hold data.context's window."""
        default = next(f.default for f in fields(DataConfig) if f.name == "context")
        if self.model.name == "gpt" and self.model.context and self.data.context == default:
            self.data.context = self.model.context


#: short names for the most used fields, one table for the CLI (`--batch-size`) and the API (`batch_size=`)
SHORTCUTS = {"dataset": "data.name", "model": "model.name", "workers": "train.workers", "epochs": "train.epochs",
             "batch_size": "train.batch_size", "lr": "optim.lr", "seed": "train.seed", "partition": "data.partition",
             "samples": "data.num_samples", "link": "link.rate", "link_mode": "link.mode", "sites": "link.sites",
             "max_restarts": "train.max_restarts", "loggers": "train.loggers"}

SECTIONS = {"train": TrainConfig, "data": DataConfig, "model": ModelConfig, "optim": OptimConfig, "link": LinkConfig,
            "elastic": ElasticConfig}


def field_type(path: str) -> type:
    """The Python type of a field's default value, e.g. int for "train.workers"."""
    section, key = path.split(".")
    return type(getattr(SECTIONS[section](), key))


def _type_name(tp) -> str:
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    return {int: "an integer", float: "a finite number", bool: "true or false", str: "a string",
            list: "a list", dict: "a table"}.get(tp, getattr(tp, "__name__", str(tp)))


def _coerce(tp, value, field_name: str):
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            try:
                return _coerce(arg, value, field_name)
            except ConfigError:
                pass
        raise ConfigError(field_name, value, "must be " + _type_name(tp))
    if origin is list:  # list[X]: each item an X
        return [_coerce(typing.get_args(tp)[0], item, field_name) for item in _coerce(list, value, field_name)]
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is float and number and math.isfinite(value):
        return float(value)
    ok = value in typing.get_args(tp) if origin is Literal else isinstance(value, tp) and (
        tp is not float and not (tp is int and isinstance(value, bool)))
    require(ok, field_name, value, "must be " + _type_name(tp))
    return value


def build(cls, raw: dict, prefix: str):
    """Build dataclass `cls` from a plain dict, checking keys and types; `prefix` names the table."""
    if not isinstance(raw, dict):
        raise ConfigError(prefix, raw, "must be a table")
    hints = typing.get_type_hints(cls)
    known = [f.name for f in fields(cls) if f.init]
    kwargs = {}
    for key, value in raw.items():
        require(key in known, f"{prefix}.{key}", value, "unknown key; known keys: " + ", ".join(known))
        kwargs[key] = _coerce(hints[key], value, f"{prefix}.{key}")
    return cls(**kwargs)


def parse_set(item: str) -> tuple[list[str], Any]:
    """Parse one `--set a.b=value` override; the value is read as TOML, else taken as a string."""
    key, sep, text = item.partition("=")
    path = key.strip().split(".")
    if not sep or len(path) < 2 or not all(path):
        raise ConfigError("--set", item, "expected SECTION.KEY=VALUE, e.g. train.epochs=10")
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        value = text
    return path, value


def _first_leaf(table: dict) -> tuple[str, Any]:
    """('a.b', value): the dotted path and value of the first non-table entry of a nested table."""
    if not table:
        return "", table
    key, value = next(iter(table.items()))
    if isinstance(value, dict) and value:
        inner, leaf = _first_leaf(value)
        return f"{key}.{inner}", leaf
    return key, value


def merge(base: dict, extra: dict, prefix: str = "") -> dict:
    """Deep-merge `extra` into a copy of `base`; a table never silently replaces a value or vice versa."""
    out = dict(base)
    for key, value in extra.items():
        where = f"{prefix}{key}"
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value, where + ".")
        elif key in out and isinstance(value, dict):  # a key under what is a value: name the key, not the value
            inner, shown = _first_leaf(value)
            raise ConfigError(f"{where}.{inner}" if inner else where, shown,
                              f"{where} is a value ({out[key]!r}), not a table with keys")
        elif key in out and isinstance(out[key], dict):
            raise ConfigError(where, value, f"{where} is a table; set its keys ({where}.KEY=VALUE), not {where} itself")
        else:
            out[key] = value
    return out


def nest(path: list[str], value) -> dict:
    """['a', 'b'], 1 -> {'a': {'b': 1}}"""
    for key in reversed(path):
        value = {key: value}
    return value


def read_toml(path: str, field: str = "--config") -> dict:
    """A TOML file as a dict; any failure to read or parse it is a ConfigError naming `field`."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(field, path, "file not found") from None
    except IsADirectoryError:
        raise ConfigError(field, path, "is a directory, expected a TOML file") from None
    except OSError as e:
        raise ConfigError(field, path, f"cannot be read ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise ConfigError(field, path, "is not UTF-8 text (a TOML file must be)") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(field, path, f"not valid TOML ({e})") from None


def from_dict(raw: dict, method_configs: dict[str, type]) -> Config:
    """Build a Config; `method_configs` maps method names to their `[method]` dataclasses."""
    raw = dict(raw)
    unknown = set(raw) - set(SECTIONS) - {"method"}
    if unknown:
        key = sorted(unknown)[0]
        raise ConfigError(key, raw[key], "unknown table; known: method, " + ", ".join(SECTIONS))
    method_raw = dict(raw.pop("method", {}))
    name = method_raw.get("name", MethodConfig.name)
    require(isinstance(name, str) and name in method_configs, "method.name", name,
            "known methods: " + ", ".join(sorted(method_configs)))
    sections = {key: build(cls, raw.get(key, {}), key) for key, cls in SECTIONS.items()}
    return Config(method=build(method_configs[name], method_raw, "method"), **sections)


def from_dict_any_method(raw: dict) -> Config:
    """A run's Config with its [method] table cut to the name: for readers that need only the data,
    model and training sections (a teacher server), so they need not know every method."""
    method = raw.get("method", {})
    name = method.get("name", MethodConfig.name) if isinstance(method, dict) else MethodConfig.name
    return from_dict({**raw, "method": {"name": name}}, {name: MethodConfig})


def to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


def to_toml(cfg: Config) -> str:
    return tomli_w.dumps(to_dict(cfg))


def _inline(value) -> str:
    """A value as TOML on one line (tables inline)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_inline(v)}" for k, v in value.items()) + "}"
    return tomli_w.dumps({"v": value})[4:].strip()


def describe(cfg: Config) -> str:
    """The whole configuration as TOML with each field's help as a comment."""
    lines = []
    for section in ("method", *SECTIONS):
        obj = getattr(cfg, section)
        lines.append(f"[{section}]")
        rules = bounds_of(type(obj))  # type: ignore[arg-type]
        for f in fields(obj):
            value = _inline(getattr(obj, f.name))
            allowed = f" (allowed: {rules[f.name].allowed()})" if f.name in rules else ""
            lines.append(f"{f.name} = {value}".ljust(34) + f"  # {f.metadata.get('help', '')}{allowed}")
        lines.append("")
    return "\n".join(lines)
