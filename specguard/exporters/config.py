"""The exporter's config sections: ``pools``, ``classes``, ``tap`` and ``scrape``.

Each section is parsed with a ``configfile.Section`` so that every error is reported at
once with its file, line, column and key path. The result is frozen data; nothing here
does I/O beyond what the caller's ``Document`` already read.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from specguard import schedules
from specguard.configfile import Section
from specguard.exporters import addresses, clientguard, promtext
from specguard.exporters.tapgate import METHODS, ForwardPath

ENGINES = ("vllm", "sglang", "trtllm", "llamacpp", "tgi", "auto")
OTHER = "other"  # task type for everything outside the configured set
NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


@dataclass(frozen=True)
class PoolConfig:
    """One engine pool the tap may forward to."""

    name: str  # label value of ``pool``
    url: str  # base URL, e.g. http://10.0.0.5:8000
    engine: str = "auto"  # vllm | sglang | trtllm | llamacpp | tgi | auto (detected from /metrics)
    num_speculative_tokens: int = 0  # K the pool was launched with; 0 = no speculation
    metrics_path: str = "/metrics"  # path of the engine's Prometheus page
    # the server runs vLLM's --enable-force-include-usage (usage sent even when not asked for):
    # the tap then neither adds stream_options.include_usage nor strips the usage chunk
    force_include_usage: bool = False
    # engine replicas behind ``url`` (a Service, a data-parallel engine): the load bucket is the
    # pool's in-flight requests per replica, and capacity-matched holdout weighs pools by it
    replicas: int = 1
    # file holding the engine's --api-key: the tap sends it as a bearer token (requests and scrapes)
    api_key_file: str | None = None
    # the in-engine K schedule the pool was launched with (vLLM num_speculative_tokens_per_batch_size,
    # TensorRT-LLM draft_len_schedule / max_concurrency; specguard.schedules): K by batch size
    k_schedule: schedules.Schedule | None = None

    @property
    def speculative(self) -> bool:
        return self.num_speculative_tokens > 0

    @property
    def display_url(self) -> str:
        """The URL for logs and messages: a password in it is masked."""
        return addresses.mask_url(self.url)


@dataclass(frozen=True)
class Bucket:
    """A named upper bound; a value falls in the first bucket whose ``max`` it does not exceed."""

    name: str
    max: float  # inclusive upper bound; ``inf`` for the last bucket


@dataclass(frozen=True)
class Matcher:
    """A rule that names a request's task type when the header is absent.

    Exactly one of ``model`` / ``path`` (regular expressions) or ``field`` (dotted JSON path of
    the body, e.g. ``metadata.task``). With ``field`` and no ``task_type`` the field's value is
    the task type; otherwise ``task_type`` is assigned when the regex (``match`` for fields)
    matches.
    """

    task_type: str | None = None
    model: str | None = None
    path: str | None = None
    field: str | None = None
    match: str | None = None


MAX_COMBINATIONS = 1024
"""Default ``classes.max_combinations``: the shipped config uses 180 (5 x 4 x 3 x 3)."""


@dataclass(frozen=True)
class ClassesConfig:
    """How requests are classified into task type x temperature bucket (x load bucket)."""

    task_header: str = "x-task-type"  # request header carrying the task type
    task_types: tuple[str, ...] = ("code", "extraction", "chat", "creative")
    matchers: tuple[Matcher, ...] = (Matcher(field="metadata.task"),)
    temperature_buckets: tuple[Bucket, ...] = (
        Bucket("greedy", 0.0),
        Bucket("low", 0.5),
        Bucket("medium", 0.9),
        Bucket("high", math.inf),
    )
    default_temperature: float = 1.0  # the engine's default when a request sets none
    # in-flight requests per replica of the pool a request goes to (itself included)
    load_buckets: tuple[Bucket, ...] = (Bucket("low", 16), Bucket("medium", 48), Bucket("high", math.inf))
    max_combinations: int = MAX_COMBINATIONS
    """Cap on task types x temperature buckets x load buckets x pools: each combination is a set
    of series on /metrics and a class the guard evaluates, so the product bounds both."""

    @property
    def task_labels(self) -> tuple[str, ...]:
        """Every task_type label value that can be exported (configured + ``other``)."""
        return self.task_types if OTHER in self.task_types else (*self.task_types, OTHER)


@dataclass(frozen=True)
class TapConfig:
    listen: str = "127.0.0.1:8090"  # host:port the tap (and /metrics, /healthz) listens on
    max_body_bytes: int = 4 * 1024 * 1024  # request bodies beyond this get 413
    upstream_timeout_seconds: float = 300.0  # idle time allowed between upstream bytes
    connect_timeout_seconds: float = 10.0  # time allowed to connect to a pool
    window_seconds: float = 900.0  # sliding window of the per-class statistics
    max_window_records: int = 100_000  # memory bound of the window, ~600 B per record (oldest dropped first)
    full_rollback_request_threshold: float = 0.5  # a request whose full-rollback round share > this
    holdout_share: float = 0.05  # holdout to the no-spec pool: the share with holdout fixed, else a ceiling
    probe_share: float = 0.05  # share of a class routed off speculation kept on a spec pool
    default_pool: str = ""  # pool for classes without a plan entry (first pool when empty)
    nospec_pool: str | None = None  # the baseline pool (first K=0 pool when empty)
    max_client_connections: int = 1024  # open client connections (also kept below the open-file limit)
    client_header_timeout_seconds: float = 30.0  # from a request head's first byte to its end
    client_body_timeout_seconds: float = 60.0  # to receive a whole request body
    client_idle_timeout_seconds: float = 75.0  # a connection with no request in flight is closed
    # a client that takes none of a response's bytes for this long is cut off (its back-pressure
    # pauses the engine's read timeout: a slow client is never counted as an engine timeout)
    client_write_timeout_seconds: float = 300.0
    max_inspect_bytes: int = 1024 * 1024  # response bytes the tap inspects; the rest is only relayed
    # a pool that cannot be connected to is marked down; its traffic goes to the best healthy pool
    # and a request whose connect failed is retried there (exporters.health, exporters.routing)
    failover: bool = True
    # exact paths forwarded besides the inference API (POST /v1/chat/completions, POST
    # /v1/completions, GET /v1/models); anything else is answered 404 by the tap (exporters.tapgate)
    forward_paths: tuple[ForwardPath, ...] = ()
    # each pool's own page at /engines/<pool>/metrics, and the forwarded API under that prefix
    # (exporters.enginepage): for tools that read the engine's page at <base-url>/metrics
    engine_pages: bool = True
    # outlier ejection (exporters.health): this many 5xx answers or resets in a row take a pool out
    # of service for eject_seconds, doubled on each repeat up to eject_max_seconds
    eject_consecutive_5xx: int = 5
    eject_seconds: float = 30.0
    eject_max_seconds: float = 300.0
    # a tapped request body with more JSON arrays and objects than this is refused (413): parsing
    # costs per container, not per byte (exporters.bodyparse)
    max_json_containers: int = 100_000

    @property
    def client_limits(self) -> clientguard.ClientLimits:
        return clientguard.ClientLimits(
            self.max_client_connections,
            self.client_header_timeout_seconds,
            self.client_body_timeout_seconds,
            self.client_idle_timeout_seconds,
        )

    @property
    def host(self) -> str:
        """The address to bind (an IPv6 address without its brackets)."""
        return (addresses.split_listen(self.listen) or ("127.0.0.1", 0))[0]

    @property
    def port(self) -> int:
        return (addresses.split_listen(self.listen) or ("", 0))[1]


@dataclass(frozen=True)
class ScrapeConfig:
    interval_seconds: float = 15.0  # how often each pool's /metrics is read
    timeout_seconds: float = 5.0  # per scrape
    max_page_bytes: int = promtext.LIMITS.max_page_bytes  # a larger page is rejected (engine_up 0)
    max_line_bytes: int = promtext.LIMITS.max_line_bytes  # a page with a longer line is rejected
    max_samples: int = promtext.LIMITS.max_samples  # a page with more samples is rejected
    down_interval_seconds: float = 2.0  # how often a pool marked down is re-checked (scraped)

    @property
    def limits(self) -> promtext.Limits:
        return promtext.Limits(self.max_page_bytes, self.max_line_bytes, self.max_samples)


@dataclass(frozen=True)
class ExporterConfig:
    pools: tuple[PoolConfig, ...]
    classes: ClassesConfig = field(default_factory=ClassesConfig)
    tap: TapConfig = field(default_factory=TapConfig)
    scrape: ScrapeConfig = field(default_factory=ScrapeConfig)

    def pool(self, name: str) -> PoolConfig:
        for pool in self.pools:
            if pool.name == name:
                return pool
        raise KeyError(name)

    @property
    def pool_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.pools)


def parse_pools(root: Section) -> tuple[PoolConfig, ...]:
    pools: list[PoolConfig] = []
    seen: set[str] = set()
    for item in root.items("pools", required=True):
        name = item.get("name", str)
        url = item.get("url", str)
        engine = item.get("engine", str, "auto", choices=ENGINES)
        k = item.get("num_speculative_tokens", int, 0, minimum=0, maximum=64)
        metrics_path = item.get("metrics_path", str, "/metrics")
        force_usage = item.get("force_include_usage", bool, False)
        replicas = item.get("replicas", int, 1, minimum=1, maximum=100_000)
        key_file = item.get("api_key_file", str, None, nullable=True)
        k_schedule = None
        try:
            k_schedule = schedules.from_pool_keys(item.data, k or 0)
        except schedules.ScheduleError as exc:
            item.error(exc.key, str(exc))
        item.reject_unknown(also_allowed=schedules.KEYS)
        if key_file is not None and not key_file.strip():
            item.error("api_key_file", "must name a file")
            key_file = None
        if name is not None:
            if not item.check(bool(NAME_RE.match(name)), "name", f"({name!r}) must match {NAME_RE.pattern}"):
                name = None
            elif not item.check(name not in seen, "name", f"duplicate pool name {name!r}"):
                name = None
        if url is not None:
            parts = urlsplit(url)
            ok = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.path in ("", "/")
            if not item.check(ok, "url", f"({url!r}) must be http(s)://host:port with no path"):
                url = None
            elif not item.check(
                addresses.port_ok(parts), "url", f"({addresses.mask_url(url)!r}): port must be 1-65535"
            ):
                url = None
        if metrics_path is not None:
            item.check(metrics_path.startswith("/"), "metrics_path", "must start with '/'")
        if name is None or url is None:
            continue
        seen.add(name)
        pools.append(
            PoolConfig(
                name,
                url.rstrip("/"),
                engine,
                k,
                metrics_path or "/metrics",
                force_usage is True,
                replicas or 1,
                key_file,
                k_schedule,
            )
        )
    if "pools" in root.data and isinstance(root.data["pools"], list) and not root.data["pools"]:
        root.error("pools", "must list at least one pool")
    elif pools and all(p.speculative for p in pools) and not (len(pools) == 1 and pools[0].k_schedule):
        names = ", ".join(f"{p.name} (K={p.num_speculative_tokens})" for p in pools)
        root.error(
            "pools",
            f"no pool without speculation: {names}; add one with num_speculative_tokens: 0 "
            "(it measures the baseline every relative cost is taken against, and it is where the "
            "guard turns speculation off), or run one pool with its in-engine K schedule "
            "(num_speculative_tokens_per_batch_size or draft_len_schedule) and no other",
        )
    return tuple(pools)


def _buckets(section: Section, key: str, default: tuple[Bucket, ...], what: str) -> tuple[Bucket, ...]:
    if key not in section.data:
        section.get(key, list, None)
        return default
    out: list[Bucket] = []
    entries = list(section.items(key))
    for index, item in enumerate(entries):
        name = item.get("name", str)
        last = index == len(entries) - 1
        upper = item.get("max", float, None, nullable=True)
        item.reject_unknown()
        if name is not None and not item.check(bool(NAME_RE.match(name)), "name", "must be a plain label"):
            continue
        if upper is None and not last:
            item.error("max", "is required (only the last bucket may be open-ended: max: null)")
            continue
        bound = math.inf if upper is None else upper
        if out and bound <= out[-1].max:
            item.error("max", f"({bound}) must be greater than the previous bucket's max ({out[-1].max})")
            continue
        if name is not None:
            if any(b.name == name for b in out):
                item.error("name", f"duplicate {what} bucket {name!r}")
                continue
            out.append(Bucket(name, bound))
    if not entries and isinstance(section.data.get(key), list):
        section.error(key, "must list at least one bucket")
    if out and out[-1].max != math.inf:
        section.error(key, f"the last {what} bucket must be open-ended (max: null) so every value fits")
    return tuple(out) or default


def _matchers(section: Section, task_types: list[str]) -> tuple[Matcher, ...]:
    if "matchers" not in section.data:
        return ClassesConfig().matchers
    out: list[Matcher] = []
    for item in section.items("matchers"):
        task_type = item.get("task_type", str, None)
        model = item.get("model", str, None)
        path = item.get("path", str, None)
        field_ = item.get("field", str, None)
        match = item.get("match", str, None)
        item.reject_unknown()
        given = [k for k, v in (("model", model), ("path", path), ("field", field_)) if v is not None]
        if len(given) != 1:
            item.error(None, "needs exactly one of model, path, field")
            continue
        bad = False
        for key, pattern in (("model", model), ("path", path), ("match", match)):
            if pattern is None:
                continue
            try:
                re.compile(pattern)
            except re.error as exc:
                item.error(key, f"invalid regular expression: {exc}")
                bad = True
        if field_ is None and task_type is None:
            item.error("task_type", "is required with model or path")
            bad = True
        if task_type is not None and task_type not in task_types and task_type != OTHER:
            item.error("task_type", f"({task_type!r}) is not in task_types")
            bad = True
        if match is not None and field_ is None:
            item.error("match", "only applies to field matchers")
            bad = True
        if not bad:
            out.append(Matcher(task_type, model, path, field_, match))
    return tuple(out)


def parse_classes(section: Section) -> ClassesConfig:
    base = ClassesConfig()
    header = section.get("task_header", str, base.task_header)
    task_types: list[str] = []
    if "task_types" in section.data:
        for index, value in section.values("task_types"):
            where = f"task_types[{index}]"
            if not isinstance(value, str) or not NAME_RE.match(value):
                section.error(where, f"({value!r}) must be a plain label")
            elif value in task_types:
                section.error(where, f"duplicate task type {value!r}")
            else:
                task_types.append(value)
    else:
        section.get("task_types", list, None)
        task_types = list(base.task_types)
    matchers = _matchers(section, task_types)
    temps = _buckets(section, "temperature_buckets", base.temperature_buckets, "temperature")
    default_t = section.get("default_temperature", float, base.default_temperature, minimum=0.0, maximum=10.0)
    loads = _buckets(section, "load_buckets", base.load_buckets, "load")
    cap = section.get("max_combinations", int, base.max_combinations, minimum=1, maximum=10_000_000)
    section.reject_unknown()
    return ClassesConfig(header.lower(), tuple(task_types), matchers, temps, default_t, loads, cap)


def check_combinations(section: Section, classes: ClassesConfig, pools: int) -> None:
    """An error at ``classes.task_types`` when the class x pool product is above the cap."""
    labels, temps, loads = (
        len(classes.task_labels),
        len(classes.temperature_buckets),
        len(classes.load_buckets),
    )
    product = labels * temps * loads * max(pools, 1)
    if product > classes.max_combinations:
        section.error(
            "task_types" if "task_types" in section else None,
            f"{labels} task types (with 'other') x {temps} temperature buckets x {loads} load buckets "
            f"x {max(pools, 1)} pools = {product} combinations, above classes.max_combinations "
            f"({classes.max_combinations}): each is a set of /metrics series and a class the guard "
            "evaluates; use fewer task types or buckets, or raise classes.max_combinations",
        )


def parse_tap(section: Section, pools: tuple[PoolConfig, ...]) -> TapConfig:
    base = TapConfig()
    listen = section.get("listen", str, base.listen)
    problem = addresses.listen_problem(listen)
    if problem is not None:
        section.error("listen", f"({listen!r}) {problem}")
        listen = base.listen
    names = [p.name for p in pools]
    default_pool = section.get("default_pool", str, names[0] if names else "")
    if names and default_pool not in names:
        section.error("default_pool", f"({default_pool!r}) is not a configured pool ({', '.join(names)})")
        default_pool = names[0]
    first_nospec = next((p.name for p in pools if not p.speculative), None)
    nospec = section.get("nospec_pool", str, first_nospec, nullable=True)
    if nospec is not None and names:
        if nospec not in names:
            section.error("nospec_pool", f"({nospec!r}) is not a configured pool ({', '.join(names)})")
            nospec = first_nospec
        elif next(p for p in pools if p.name == nospec).speculative:
            section.error("nospec_pool", f"({nospec!r}) has num_speculative_tokens > 0")
            nospec = first_nospec
    cfg = TapConfig(
        listen=listen,
        max_body_bytes=section.get("max_body_bytes", int, base.max_body_bytes, minimum=1024),
        upstream_timeout_seconds=section.get(
            "upstream_timeout_seconds", float, base.upstream_timeout_seconds, minimum=0.001
        ),
        connect_timeout_seconds=section.get(
            "connect_timeout_seconds", float, base.connect_timeout_seconds, minimum=0.001
        ),
        window_seconds=section.get("window_seconds", float, base.window_seconds, minimum=1.0),
        max_window_records=section.get("max_window_records", int, base.max_window_records, minimum=100),
        full_rollback_request_threshold=section.get(
            "full_rollback_request_threshold",
            float,
            base.full_rollback_request_threshold,
            minimum=0.0,
            maximum=1.0,
        ),
        holdout_share=section.get("holdout_share", float, base.holdout_share, minimum=0.0, maximum=0.5),
        probe_share=section.get("probe_share", float, base.probe_share, minimum=0.0, maximum=0.5),
        default_pool=default_pool,
        nospec_pool=nospec,
        max_client_connections=section.get(
            "max_client_connections", int, base.max_client_connections, minimum=1, maximum=1 << 20
        ),
        client_header_timeout_seconds=section.get(
            "client_header_timeout_seconds", float, base.client_header_timeout_seconds, minimum=0.01
        ),
        client_body_timeout_seconds=section.get(
            "client_body_timeout_seconds", float, base.client_body_timeout_seconds, minimum=0.01
        ),
        client_idle_timeout_seconds=section.get(
            "client_idle_timeout_seconds", float, base.client_idle_timeout_seconds, minimum=0.01
        ),
        client_write_timeout_seconds=section.get(
            "client_write_timeout_seconds", float, base.client_write_timeout_seconds, minimum=0.01
        ),
        max_inspect_bytes=section.get(
            "max_inspect_bytes", int, base.max_inspect_bytes, minimum=4096, maximum=256 << 20
        ),
        failover=section.get("failover", bool, base.failover),
        forward_paths=_forward_paths(section),
        engine_pages=section.get("engine_pages", bool, base.engine_pages),
        eject_consecutive_5xx=section.get(
            "eject_consecutive_5xx", int, base.eject_consecutive_5xx, minimum=1, maximum=10_000
        ),
        eject_seconds=section.get("eject_seconds", float, base.eject_seconds, minimum=0.1, maximum=86_400),
        max_json_containers=section.get(
            "max_json_containers", int, base.max_json_containers, minimum=100, maximum=10_000_000
        ),
        eject_max_seconds=section.get(
            "eject_max_seconds", float, base.eject_max_seconds, minimum=0.1, maximum=86_400
        ),
    )
    section.reject_unknown()
    low, high = cfg.eject_seconds, cfg.eject_max_seconds
    if low is not None and high is not None and high < low:
        section.error("eject_max_seconds", f"({high}) must be >= eject_seconds ({low})")
    return cfg


_PATH_RE = re.compile(r"^/[A-Za-z0-9._~!$&'()*+,;=:@/-]*$")


def _forward_paths(section: Section) -> tuple[ForwardPath, ...]:
    """``tap.forward_paths``: ``[{path: /exact/path, methods: [POST]}]``, each path once."""
    out: list[ForwardPath] = []
    seen: set[str] = set()
    for item in section.items("forward_paths"):
        path = item.get("path", str)
        methods: list[str] = []
        if "methods" in item.data:
            for index, value in item.values("methods"):
                where = f"methods[{index}]"
                if not isinstance(value, str) or value.upper() not in METHODS:
                    item.error(where, f"({value!r}) must be one of {', '.join(METHODS)}")
                elif value.upper() not in methods:
                    methods.append(value.upper())
            if not methods and isinstance(item.data.get("methods"), list):
                item.error("methods", "must list at least one method")
        else:
            methods = ["POST"]
        item.reject_unknown()
        if path is None:
            continue
        bad = ".." in path.split("/") or "." in path.split("/") or "//" in path
        if not _PATH_RE.match(path) or bad:
            item.error(
                "path",
                f"({path!r}) must be an exact path starting with '/', without a query, '%'-escapes, "
                "'.' or '..' segments or '//'",
            )
            continue
        if path in seen:
            item.error("path", f"duplicate forward path {path!r}")
            continue
        seen.add(path)
        if methods:
            out.append(ForwardPath(path, tuple(methods)))
    return tuple(out)


def parse_scrape(section: Section) -> ScrapeConfig:
    base = ScrapeConfig()
    interval = section.get("interval_seconds", float, base.interval_seconds, minimum=0.01)
    timeout = section.get("timeout_seconds", float, base.timeout_seconds, minimum=0.01)
    page = section.get("max_page_bytes", int, base.max_page_bytes, minimum=1024, maximum=256 << 20)
    line = section.get("max_line_bytes", int, base.max_line_bytes, minimum=256, maximum=16 << 20)
    samples = section.get("max_samples", int, base.max_samples, minimum=100, maximum=10_000_000)
    down = section.get("down_interval_seconds", float, base.down_interval_seconds, minimum=0.1)
    section.reject_unknown()
    if interval is not None and timeout is not None and timeout > interval:
        section.error("timeout_seconds", f"({timeout}) must be <= interval_seconds ({interval})")
    return ScrapeConfig(interval, timeout, page, line, samples, down)


def parse_exporter(root: Section) -> ExporterConfig:
    """Parse the four exporter sections of the main config (issues are recorded on the document)."""
    pools = parse_pools(root)
    classes = parse_classes(root.section("classes"))
    check_combinations(root.section("classes"), classes, len(pools))
    tap = parse_tap(root.section("tap"), pools)
    scrape = parse_scrape(root.section("scrape"))
    return ExporterConfig(pools, classes, tap, scrape)
