"""Seeded generators of broken inputs (issue 15): model, GPU, cluster and profile files,
nccl-tests logs and command lines. ``make_case(seed)`` is a pure function of ``seed``, so a
failing case is replayed with its seed alone (``python benchmarks/fuzz.py --replay SEED``).

A case is a command line with placeholders (``{model}``, ``{gpu}``, ``{cluster}``,
``{profile}``, ``{log}``, ``{out}``) and the bytes of the files they name. Most mutations are
hostile (wrong types, huge or non-finite numbers, YAML tags, aliases, deep nesting, binary
content); some inputs stay valid so the contract is also checked on runs that succeed.
"""

from __future__ import annotations

import functools
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NCCL_LOGS = REPO / "tests" / "data" / "nccl"
MARKER = "PWNED"
"""A YAML tag that executes code would create a file of this name in the case's folder."""

# YAML value snippets: each is written verbatim after ``key: ``.
HOSTILE_YAML: tuple[str, ...] = (
    "0", "-1", "1", "2", "3", "7", "-7", "4096", "65536", "1048577", "2147483648",
    "9223372036854775808", "1" + "0" * 30, "9" * 5000, "1e308", "-1e308", "1e-320", ".nan",
    ".inf", "-.inf", "1.5", "0.5", "4096.0", "''", "' '", "'x'", "'" + "x" * 5000 + "'",
    "[1]", "[]", "{}", "{a: 1}", "null", "~", "true", "false", "2020-01-01", "2020-13-45",
    "!!binary AAAA", f"!!python/object/apply:os.system ['touch {MARKER}']",
    "!!python/name:os.system", f"!!python/object/new:os.system ['touch {MARKER}']",
    "*undefined", "0x10", "0o17", "1_000", "'4096'", "!!set {1, 2}", "!!float 'nan'",
    "!!int '12'", "[" * 40 + "1" + "]" * 40,
    "'\\u0000'", '"\\x00\\xff"', "|\n  multi\n  line", "&anchor 8", "!!str 8",
)  # fmt: skip
HOSTILE_TOKENS: tuple[str, ...] = (
    "0", "-1", "nan", "NaN", "inf", "-inf", "1e999", "N/A", "x", "", "1e308", "9" * 400,
    "0.0", "1e-300", "-0", "1,000", "0x10", "\x00", "\u00e9", "18446744073709551617",
)  # fmt: skip
HOSTILE_FLAG_VALUES: tuple[str, ...] = (
    "0", "-1", "1", "2", "3", "7", "8", "1021", "1024", "1048576", "1048577", str(2**63),
    str(10**30), "9" * 5000, "1e3", "abc", "", " ", "nan", "inf", "-inf", "0.5", "1.5",
    "2**63", "10**30", "\x00", "x" * 5000, "8,16", "any", "none", "\u00e9",
)  # fmt: skip
LONG_NAME = "m" * 5000 + ".yaml"
"""Longer than any OS allows for a file name (NAME_MAX is 255 on Linux)."""

TINY_MODEL: dict[str, object] = {
    "num_hidden_layers": 4,
    "hidden_size": 256,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "intermediate_size": 688,
    "vocab_size": 1000,
    "hidden_act": "silu",
    "model_type": "llama",
}
TINY_MOE: dict[str, object] = {
    **TINY_MODEL,
    "model_type": "mixtral",
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
}
GPU: dict[str, object] = {
    "name": "fuzz-gpu",
    "memory_gib": 79.6,
    "peak_bf16_tflop_per_s": 989,
    "peak_fp8_tflop_per_s": 1979,
    "hbm_tb_per_s": 3.35,
    "nvlink_gb_per_s": 450,
    "nic_gb_per_s": 50,
    "gpus_per_node": 8,
}
CLUSTER: dict[str, object] = {"gpu": "h100", "gpus_per_node": 8, "nic_gb_per_s": 25}
LOGS: tuple[str, ...] = (
    "a100_1n8g_all_reduce_abci.log",
    "a100_1n2g_sendrecv_ncclissue331.log",
    "a100_1n8g_all_gather_superbench.log",
    "a100_2n8g_all_reduce_abci.log",
)
FORMATS: tuple[str, ...] = ("table", "json", "csv", "megatron", "torchtitan", "deepspeed")


@dataclass(frozen=True)
class Case:
    """One generated input: ``argv`` with placeholders, the files they name, and what the
    contract needs to know (the ``--time-limit`` given, the output set-up)."""

    seed: int
    kind: str
    argv: tuple[str, ...]
    files: dict[str, bytes] = field(default_factory=dict)
    output: str = "none"
    """``none``, ``fresh`` (a new file), ``existing`` (a file with known bytes), ``directory``,
    ``missing-dir`` (in a folder that does not exist), ``long`` (a name the OS refuses)."""
    time_limit_s: float | None = None

    def describe(self) -> str:
        shown = " ".join(a if len(a) < 60 else a[:57] + "..." for a in self.argv)
        return f"seed={self.seed} kind={self.kind} output={self.output} argv: {shown}"


# ---------------------------------------------------------------------------------------------
# serialising mappings with hostile values


def _yaml_scalar(value: object) -> str:
    if isinstance(value, str | list | dict):
        return json.dumps(value)  # JSON is YAML: strings, lists and mappings as flow style
    return str(value).lower()


def yaml_text(mapping: dict[str, object], raw: dict[str, str] | None = None) -> str:
    """``key: value`` lines; ``raw`` values are written verbatim (tags, aliases, bombs...)."""
    raw = raw or {}
    lines = []
    for key, value in mapping.items():
        if key in raw:
            continue
        if isinstance(value, dict):
            inner = ", ".join(f"{k}: {_yaml_scalar(v)}" for k, v in value.items())
            lines.append(f"{key}: {{{inner}}}")
        else:
            lines.append(f"{key}: {_yaml_scalar(value)}")
    lines += [f"{key}: {text}" for key, text in raw.items()]
    return "\n".join(lines) + "\n"


def alias_bomb(levels: int, width: int = 9) -> str:
    """The "billion laughs" document: ``width ** levels`` scalars from a few hundred bytes."""
    lines = [f"l0: &l0 [{', '.join(['lol'] * width)}]"]
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


def _whole_file(rng: random.Random) -> bytes:
    """A file that is broken as a whole, whatever it should hold."""
    choice = rng.randrange(14)
    if choice == 0:
        return b""
    if choice == 1:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 400)))
    if choice == 2:
        return "\u00e9t\u00e9: 1\n".encode("latin-1")
    if choice == 3:
        return "num_hidden_layers: 4\n".encode("utf-16")
    if choice == 4:
        return alias_bomb(rng.randrange(3, 10)).encode() + b"num_hidden_layers: *l2\n"
    if choice == 5:
        depth = rng.choice((40, 1000, 100_000))
        return ("[" * depth + "]" * depth).encode()
    if choice == 6:
        depth = rng.choice((40, 1000, 100_000))
        return ('{"a": ' * depth + "1" + "}" * depth).encode()
    if choice == 7:
        return b"1: 2\nnull: 3\n? [1]\n: 4\n"
    if choice == 8:
        return b"- 1\n- 2\n"
    if choice == 9:
        return b"just a string\n"
    if choice == 10:
        return f"!!python/object/apply:os.system ['touch {MARKER}']\n".encode()
    if choice == 11:
        return b"a: [1, 2\nb: 3\n"
    if choice == 12:
        return b"x: 1\n" * rng.choice((10, 300_000))
    return b"\xef\xbb\xbfnum_hidden_layers: 4\r\n\t\x00"


def mutate_mapping(rng: random.Random, base: dict[str, object], extra_keys: tuple[str, ...]) -> str:
    """``base`` as YAML with 1-3 mutations: a hostile value, a deleted key, an unknown or
    near-miss key, a non-string key."""
    data = dict(base)
    raw: dict[str, str] = {}
    keys = list(base) + list(extra_keys)
    for _ in range(rng.choice((0, 1, 1, 2, 3))):
        op = rng.randrange(10)
        key = rng.choice(keys)
        if op <= 5:
            raw[key] = rng.choice(HOSTILE_YAML)
        elif op == 6:
            data.pop(key, None)
        elif op == 7:
            data[key[:-1] + "x"] = 1  # near miss of a known key
        elif op == 8:
            raw["? [1, 2]\n"] = ""  # complex key; rendered below
        else:
            data[key] = rng.choice((1, 8, 64, 4096, 0.5))
    text = yaml_text(data, {k: v for k, v in raw.items() if not k.startswith("?")})
    if any(k.startswith("?") for k in raw):
        text += "? [1, 2]\n: 3\n"
    return text


def mutate_json(rng: random.Random, base: dict[str, object]) -> str:
    data = dict(base)
    text = json.dumps(data)
    op = rng.randrange(5)
    key = rng.choice(list(base))
    value = rng.choice(("NaN", "Infinity", "9" * 5000, "-1", "0", "[1]", '"x"', "1e999", "null"))
    if op == 0:
        return text.replace(f'"{key}": {json.dumps(base[key])}', f'"{key}": {value}', 1)
    if op == 1:
        return text[: rng.randrange(len(text))]
    if op == 2:
        return text[:-1] + ', "a": ' + "[" * 100_000 + "]" * 100_000 + "}"
    if op == 3:
        return text.replace(f'"{key}"', '"' + key + "x" * 3000 + '"', 1)
    return json.dumps({**data, "architectures": ["LlamaForCausalLM"], key: value})


# ---------------------------------------------------------------------------------------------
# command lines


def _flag_value(rng: random.Random, good: tuple[str, ...]) -> str:
    return rng.choice(good) if rng.random() < 0.75 else rng.choice(HOSTILE_FLAG_VALUES)


def _solve_args(rng: random.Random, *, model: str = "{model}") -> list[str]:
    args = ["--model", model, "--gpus", _flag_value(rng, ("1", "2", "4", "8", "16"))]
    if rng.random() < 0.5:
        args += ["--global-batch", _flag_value(rng, ("8", "16", "32", "64"))]
    if rng.random() < 0.5:
        args += ["--seq-len", _flag_value(rng, ("128", "256", "1024"))]
    return args


def _time_limit(rng: random.Random) -> tuple[list[str], float]:
    good = ("0.5", "1", "1", "2")
    value = (
        _flag_value(rng, good)
        if rng.random() < 0.5
        else rng.choice(good + ("0", "-1", "nan", "inf", "1e9", "abc"))
    )
    try:
        limit = float(value)
    except ValueError:
        limit = 10.0
    return ["--time-limit", value], limit


def _output(rng: random.Random, fmt_formats: tuple[str, ...]) -> tuple[list[str], str]:
    setup = (
        rng.choice(("none", "none", "fresh", "existing"))
        if rng.random() < 0.75
        else rng.choice(("directory", "missing-dir", "long"))
    )
    args = ["--format", rng.choice(fmt_formats)] if rng.random() < 0.7 else []
    if setup != "none":
        args += ["--output", "{out}"]
    return args, setup


def _solve_case(
    rng: random.Random,
    seed: int,
    kind: str,
    files: dict[str, bytes],
    model: str = "{model}",
    extra: tuple[str, ...] = (),
) -> Case:
    command = rng.choice(("solve", "solve", "evaluate", "sweep"))
    args = [command, *_solve_args(rng, model=model), *extra]
    limit = None
    if command != "evaluate":
        limit_args, limit = _time_limit(rng)
        args += limit_args
    if command == "solve" and rng.random() < 0.3:
        args += ["--top", _flag_value(rng, ("1", "3", "5"))]
    if command != "evaluate" and rng.random() < 0.15:
        args += ["--pipeline-plan", "per-stage"]
    if command == "sweep" and rng.random() < 0.4:
        args += ["--train-tokens", rng.choice(("1e12", "inf", "nan", "-1", "1e30", "x"))]
    if command == "evaluate" and rng.random() < 0.5:
        args += ["--tp", _flag_value(rng, ("1", "2", "4")), "--pp", _flag_value(rng, ("1", "2"))]
    formats = ("table", "json", "csv") if command == "sweep" else FORMATS
    out_args, setup = _output(rng, formats)
    return Case(seed, kind, tuple(args + out_args), files, setup, limit)


@functools.cache
def preset_models() -> tuple[dict[str, object], ...]:
    """Every model preset as its mapping (all the families autopar reads: dense, MoE,
    multi-latent attention, hybrid Mamba ...), in file-name order."""
    import yaml

    folder = REPO / "autopar" / "presets" / "models"
    return tuple(yaml.safe_load(path.read_text()) for path in sorted(folder.glob("*.yaml")))


def _model_case(rng: random.Random, seed: int) -> Case:
    roll = rng.random()
    base = (
        TINY_MOE if roll < 0.2 else TINY_MODEL if roll < 0.55 else dict(rng.choice(preset_models()))
    )
    roll = rng.random()
    if roll < 0.15:
        files = {"model.yaml": _whole_file(rng)}
    elif roll < 0.3:
        files = {"model.json": mutate_json(rng, base).encode()}
    else:
        extra = ("head_dim", "tie_word_embeddings", "mlp_kind", "n_layer", "decoder_sparse_step")
        files = {"model.yaml": mutate_mapping(rng, base, extra).encode()}
    name = next(iter(files))
    return _solve_case(rng, seed, "model", files, model="{" + name + "}")


def _gpu_case(rng: random.Random, seed: int) -> Case:
    if rng.random() < 0.15:
        files = {"gpu.yaml": _whole_file(rng)}
    else:
        files = {"gpu.yaml": mutate_mapping(rng, GPU, ("aliases", "description")).encode()}
    files["model.yaml"] = yaml_text(TINY_MODEL).encode()
    extra = ["--gpu", "{gpu.yaml}"]
    if rng.random() < 0.3:
        extra += ["--gpus-per-node", _flag_value(rng, ("4", "8"))]
    return _solve_case(rng, seed, "gpu", files, model="{model.yaml}", extra=tuple(extra))


def _cluster_case(rng: random.Random, seed: int) -> Case:
    base = dict(CLUSTER)
    if rng.random() < 0.4:
        base["gpu"] = dict(GPU)
    if rng.random() < 0.3:
        base["comm_profile"] = "profile.yaml"
    roll = rng.random()
    if roll < 0.15:
        text = _whole_file(rng)
    else:
        extra = ("memory_reserve_gib", "intra_node_latency_us", "memory_gib", "comm_profile")
        text = mutate_mapping(rng, base, extra).encode()
    files = {"cluster.yaml": text, "model.yaml": yaml_text(TINY_MODEL).encode()}
    files["profile.yaml"] = mutate_profile(rng).encode() if rng.random() < 0.5 else b""
    return _solve_case(
        rng, seed, "cluster", files, model="{model.yaml}", extra=("--cluster", "{cluster.yaml}")
    )


# ---------------------------------------------------------------------------------------------
# communication profiles and nccl-tests logs


def base_profile() -> dict[str, object]:
    """A small valid profile (one curve, one fit), as ``save_profile`` writes it."""
    sizes = [float(2**i) for i in range(10, 27, 2)]
    return {
        "version": 1,
        "curves": [
            {
                "collective": "all_reduce",
                "num_ranks": 8,
                "num_nodes": 1,
                "size_bytes": sizes,
                "time_s": [2e-5 + s / 150e9 for s in sizes],
                "sources": ["a.log"],
            }
        ],
        "fits": [
            {
                "collective": "all_reduce",
                "span": "intra",
                "regimes": [
                    {
                        "min_size_bytes": 0.0,
                        "latency_per_step_s": 4e-6,
                        "inverse_busbw_s_per_byte": 6e-12,
                        "ramp_coefficient": 4e-7,
                        "ramp_exponent": 0.7,
                    }
                ],
                "max_size_bytes": sizes[-1],
                "saturated": False,
                "rank_counts": [8],
                "node_counts": [1],
                "ranks_per_node": 8.0,
                "notes": [],
                "median_abs_pct_error": 2.5,
            }
        ],
        "sources": [],
        "gemm": [{"m": 4096, "n": 4096, "k": 4096, "dtype": "bf16", "flop_per_s": 6e14}],
    }


def _paths(node: object, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out += _paths(value, (*prefix, i))
    return out


def mutate_profile(rng: random.Random) -> str:
    """The base profile as JSON-flavoured YAML with one to three values replaced."""
    data = base_profile()
    for _ in range(rng.choice((0, 1, 1, 2, 3))):
        path = rng.choice(_paths(data)[1:])
        parent = data
        for step in path[:-1]:
            parent = parent[step]
        replacement = rng.choice(
            (None, 0, -1, 1e400, float("nan"), "x", [], {}, [1, "a"], {"a": 1}, True, 2**80,
             [0.0, -1.0], "all_to_all", "inter", 5)
        )  # fmt: skip
        if rng.random() < 0.15 and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = replacement
    # YAML 1.1 reads .nan/.inf; json.dumps writes NaN/Infinity, which YAML reads as strings
    text = json.dumps(data).replace("NaN", ".nan").replace("Infinity", ".inf")
    return text


def mutate_log(rng: random.Random) -> tuple[str, bytes]:
    """(file name, content): a real nccl-tests log with lines cut, tokens replaced, Rank
    lines reduced to one, binary noise, or a name that claims another shape."""
    name = rng.choice(LOGS)
    lines = (NCCL_LOGS / name).read_text().splitlines()
    for _ in range(rng.choice((0, 1, 1, 2, 3))):
        op = rng.randrange(9)
        i = rng.randrange(len(lines))
        if op <= 2:  # replace a token of a data or header line
            tokens = lines[i].split()
            if tokens:
                tokens[rng.randrange(len(tokens))] = rng.choice(HOSTILE_TOKENS)
                lines[i] = "  ".join(tokens)
        elif op == 3:
            lines = lines[: rng.randrange(1, len(lines) + 1)]
        elif op == 4:
            lines = [ln for ln in lines if "Rank" not in ln or " 0 Pid" in ln]
        elif op == 5:
            del lines[i]
        elif op == 6:
            lines.insert(i, lines[i])
        elif op == 7:
            name = rng.choice(
                (
                    "x_1n1g_all_reduce_f.log",
                    "x_99999999n8g_all_reduce.log",
                    "x_0n0g_all_reduce.log",
                    "broadcast.log",
                    "x.log",
                    name,
                )
            )
        else:
            lines.insert(i, "\x00\xff garbage \u202e")
    content = "\n".join(lines).encode("utf-8", errors="surrogateescape")
    if rng.random() < 0.05:
        content = bytes(rng.randrange(256) for _ in range(200))
    return name, content


def _profile_case(rng: random.Random, seed: int) -> Case:
    files = {
        "profile.yaml": _whole_file(rng) if rng.random() < 0.1 else mutate_profile(rng).encode(),
        "model.yaml": yaml_text(TINY_MODEL).encode(),
    }
    if rng.random() < 0.6:
        return _solve_case(
            rng,
            seed,
            "profile",
            files,
            model="{model.yaml}",
            extra=("--comm-profile", "{profile.yaml}"),
        )
    name = rng.choice(LOGS)
    files[name] = (NCCL_LOGS / name).read_bytes()
    argv = ("calibrate", "--compare", "--profile", "{profile.yaml}", "{" + name + "}")
    return Case(seed, "profile", argv, files)


def _log_case(rng: random.Random, seed: int) -> Case:
    name, content = mutate_log(rng)
    files = {name: content}
    argv = ["calibrate", "{" + name + "}"]
    if rng.random() < 0.3:
        argv += ["--gpus-per-node", _flag_value(rng, ("8",))]
    if rng.random() < 0.2:
        argv += ["--gpu", rng.choice(("", "A100", "x" * 300))]
    if rng.random() < 0.2:
        files["profile.yaml"] = yaml_text({"version": 1, "curves": [], "fits": []}).encode()
        argv = ["calibrate", "--compare", "--profile", "{profile.yaml}", "{" + name + "}"]
        return Case(seed, "nccl", tuple(argv), files)
    out_args, setup = _output(rng, ("table", "json"))
    setup = "fresh" if setup == "none" else setup
    argv += [a for a in out_args if a != "--output" and a != "{out}"] + ["--output", "{out}"]
    return Case(seed, "nccl", tuple(argv), files, setup)


FLAG_POOL: tuple[str, ...] = (
    "--gpus", "--seq-len", "--global-batch", "--global-batch-tokens", "--gpus-per-node", "--gpu",
    "--tp", "--pp", "--cp", "--ep", "--vpp", "--mbs", "--dp", "--max-pp", "--max-tp", "--max-mbs",
    "--max-vpp", "--top", "--time-limit", "--num-workers", "--precision", "--grad-precision",
    "--framework", "--recompute", "--zero", "--cost-model", "--cluster", "--comm-profile",
    "--format", "--stack", "--memory-reserve-gib", "--fp8-recipe", "--fp8-gemms",
    "--cp-comm-type", "--pipeline-plan", "--stage-layers", "--stage-recompute", "--jobs",
    "--executor",
)  # fmt: skip
SPECIAL_VALUES: dict[str, tuple[str, ...]] = {
    "--gpu": ("", " ", "h100", "h1000", LONG_NAME, "a/b/c.yaml", "/dev/zero", "/", "\x00"),
    "--cost-model": (":", "json:loads", "os:getcwd", "cost_models.default", "nonexistent:x",
                     "autopar:solve", "cost_models.default:default_cost_model", "a b:c"),
    "--cluster": ("", "/", "/dev/null", LONG_NAME, "missing.yaml"),
    "--comm-profile": ("", "/", "/dev/null", LONG_NAME, "missing.yaml"),
    "--precision": ("bf16", "fp8", "fp4", ""),
    "--framework": ("megatron", "torchtitan", "deepspeed", "jax", ""),
    "--recompute": ("any", "none,full", "bogus", ",", ""),
    "--zero": ("any", "0,1", "3", "9", "", ","),
    "--format": FORMATS + ("xml", ""),
    "--stack": ("nemo-24.07", "megatron-lm", "", "nope", LONG_NAME, "/", "/dev/zero"),
    "--memory-reserve-gib": ("0", "4", "nan", "inf", "-1", "1e30", "80", "79.6"),
    "--fp8-recipe": ("delayed", "mxfp8", "blockwise", "x", ""),
    "--fp8-gemms": ("qkv,fc1", "", ",", "bogus", "qkv," * 1000),
    "--cp-comm-type": ("p2p", "a2a", "a2a+p2p", "x", ""),
    "--pipeline-plan": ("uniform", "per-stage", "per-stage", "x", ""),
    "--stage-layers": ("2,2", "4", "1,3", "0,4", ",", "9" * 30 + ",1", "1," * 3000),
    "--stage-recompute": ("none,full:1", "selective", "full:0", "full:999999", "x", ""),
    "--jobs": ("1", "2", "0", "100000", "-1"),
    "--executor": ("processes", "dask", "x", ""),
}  # fmt: skip


def _flags_case(rng: random.Random, seed: int) -> Case:
    command = rng.choice(("solve", "solve", "evaluate", "sweep", "models", "gpus"))
    if command in ("models", "gpus"):
        argv = [command] + (
            ["--show", rng.choice(("llama-70b", "h100", "", LONG_NAME, "x"))]
            if rng.random() < 0.7
            else []
        )
        return Case(seed, "flags", tuple(argv))
    model = rng.choice(("{model.yaml}", "llama-8b", "", "llama-70", LONG_NAME, "/", "/dev/zero"))
    files = {"model.yaml": yaml_text(TINY_MODEL).encode()}
    argv = [command, "--model", model]
    if rng.random() < 0.9:
        argv += ["--gpus", _flag_value(rng, ("8", "16", "1021"))]
    limit = None
    for flag in rng.sample(FLAG_POOL, rng.randrange(1, 5)):
        values = SPECIAL_VALUES.get(flag) or ("1", "2", "4", "8")
        value = rng.choice(values) if rng.random() < 0.5 else rng.choice(HOSTILE_FLAG_VALUES)
        if command == "evaluate" and flag in ("--top", "--time-limit", "--dp", "--max-pp"):
            continue
        argv += [flag, value]
        if flag == "--time-limit":
            try:
                limit = float(value)
            except ValueError:
                limit = None
    if command != "evaluate" and "--time-limit" not in argv:
        argv += ["--time-limit", "1"]
        limit = 1.0
    out_args, setup = _output(rng, FORMATS)
    if "--format" in argv:
        out_args = [a for a in out_args if a not in FORMATS and a != "--format"]
    return Case(seed, "flags", tuple(argv + out_args), files, setup, limit)


STACK: dict[str, object] = {
    "name": "fuzz-stack",
    "flash_attention": True,
    "tp_comm_overlap": False,
    "overlap_grad_reduce": True,
    "overlap_param_gather": True,
    "pp_comm_overlap": False,
    "cp_comm_type": "p2p",
    "ep_comm_overlap": False,
    "fp8_recipe": "delayed",
    "grad_reduce_dtype": "fp32",
    "cross_entropy_fusion": False,
    "dropout": True,
    "memory_reserve_gib": 0,
}


def _stack_case(rng: random.Random, seed: int) -> Case:
    if rng.random() < 0.15:
        text = _whole_file(rng)
    else:
        text = mutate_mapping(rng, STACK, ("fp8_gemms", "description", "aliases")).encode()
    files = {"stack.yaml": text, "model.yaml": yaml_text(TINY_MODEL).encode()}
    extra: tuple[str, ...] = ("--stack", "{stack.yaml}")
    if rng.random() < 0.3:
        extra += ("--precision", "fp8")
    return _solve_case(rng, seed, "stack", files, model="{model.yaml}", extra=extra)


GENERATORS = {
    "model": _model_case,
    "gpu": _gpu_case,
    "cluster": _cluster_case,
    "profile": _profile_case,
    "nccl": _log_case,
    "flags": _flags_case,
    "stack": _stack_case,
}


def make_case(seed: int) -> Case:
    """The case of ``seed``: the kind cycles with the seed, the content is drawn from it."""
    rng = random.Random(seed)
    kinds = list(GENERATORS)
    return GENERATORS[kinds[seed % len(kinds)]](rng, seed)
