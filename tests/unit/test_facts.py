"""One owner per fact: the model's fixed numbers live in wan/geometry.py, each choice list in
the module that interprets it. Everything else imports them; this test reads the source
(no import) and fails on a second definition, a stray ``// 4`` / ``// 8`` on frame or pixel
arithmetic or its inverse (``(f - 1) * 4 + 1``, ``8 * lat_h``: latent sizes back to video
sizes), or a second literal copy of a choice list."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The pack and the scripts that run it; tests/ computes expected values on its own on purpose.
SCANNED = ("wan", "loaders", "pipeline", "nodes", "tools", "bench")
OWNER = "wan/geometry.py"

# Names of the geometry facts (today's and the copies they replaced): defined in OWNER only.
GEOMETRY_NAMES = {
    "VAE_STRIDE_T", "VAE_STRIDE_S", "TEMPORAL_FACTOR", "SPATIAL_FACTOR", "FRAMES_PER_LATENT", "PATCH_SIZE",
    "SIZE_MULTIPLE", "LATENT_CHANNELS", "CHUNK_FRAMES", "CHUNK_LATENT_FRAMES", "MAX_TOKENS", "TEXT_TOKENS",
    "MAX_SEED", "SEED_MAX", "TRAINED_SIZE",
}
GEOMETRY_FUNCTIONS = {"latent_frames", "video_frames", "latent_size", "latent_shape", "video_tokens", "check_seed"}
# Divisions by 4 or 8 that are not the VAE's strides, each with its reason.
ALLOWED_DIVISIONS = {
    ("wan/vae.py", "tile // 4"): "the default overlap of decode tiles is a quarter of the tile, a tiling choice",
    ("loaders/nf4.py", "packed_bits // 8"): "bits to bytes of a packed 4-bit weight",
}
# A multiplication by a stride is a latent size turned back into a video size when the other
# factor is "n - 1" (or the product is followed by "+ 1": 4n + 1 frames), or a plain name,
# attribute or subscript (never a call's result: ``latent.numel() * 4`` counts bytes) that names
# a latent or video size.
SIZE_NAME = re.compile(r"lat|frame|height|width|tile|^[hw]$|_[hw]$", re.IGNORECASE)
# Each choice list's values, and the one module that may write them as a literal.
CHOICE_LISTS = {
    ("unipc", "euler"): "wan/scheduler.py",
    ("turn", "continuous"): "pipeline/play/protocol.py",
    ("wasdijkl",): "wan/camera_actions.py",
    (".pth", ".safetensors"): "loaders/weight_role.py",
    ("fp32", "bf16"): "pipeline/guards.py",  # the VAE's precisions (a dict there)
    ("bf16", "int8"): "wan/runtime/kv_cache.py",  # the KV cache's dtypes
}


def _files(root: Path) -> list[Path]:
    return sorted(p for top in SCANNED if (root / top).is_dir() for p in (root / top).rglob("*.py"))


def _literal(node: ast.AST) -> tuple | None:
    """The constant strings of a tuple/list literal (or a lone string constant)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return (node.value,)
    if isinstance(node, (ast.Tuple, ast.List)) and node.elts and all(
            isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
        return tuple(e.value for e in node.elts)
    return None


def _is_seed_power(node: ast.AST) -> bool:
    return (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow) and isinstance(node.left, ast.Constant)
            and node.left.value == 2 and isinstance(node.right, ast.Constant) and node.right.value == 64)


def _is_stride(node: ast.AST, strides: tuple[int, ...] = (4, 8)) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int and node.value in strides


def _minus_one(node: ast.AST) -> bool:
    return (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub) and isinstance(node.right, ast.Constant)
            and node.right.value == 1)


def _names_a_size(node: ast.AST) -> bool:
    parts = list(ast.walk(node))
    if not isinstance(node, (ast.Name, ast.Attribute, ast.Subscript)) or any(isinstance(p, ast.Call) for p in parts):
        return False
    names = [p.id if isinstance(p, ast.Name) else p.attr for p in parts if isinstance(p, (ast.Name, ast.Attribute))]
    return any(SIZE_NAME.search(name) for name in names)


def _stride_product(node: ast.AST) -> bool:
    """``node`` multiplies a latent size by a VAE stride (see SIZE_NAME's comment)."""
    if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult)):
        return False
    parent = getattr(node, "parent", None)
    plus_one = (isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.Add)
                and any(isinstance(side, ast.Constant) and side.value == 1 for side in (parent.left, parent.right)))
    for factor, other in ((node.left, node.right), (node.right, node.left)):
        if _is_stride(factor, (4,)) and (_minus_one(other) or plus_one):
            return True
        if _is_stride(factor) and _names_a_size(other):
            return True
    return False


def find_problems(root: Path) -> list[str]:
    problems = []
    for path in _files(root):
        rel = path.relative_to(root).as_posix()
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source, filename=rel)
        _mark_parents(tree)
        owner = rel == OWNER
        for node in ast.walk(tree):
            where = f"{rel}:{getattr(node, 'lineno', None) or getattr(getattr(node, 'parent', None), 'lineno', '?')}"
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.FloorDiv) and not owner:
                if isinstance(node.right, ast.Constant) and node.right.value in (4, 8):
                    text = ast.get_source_segment(source, node) or ""
                    if not any(rel == f and snippet in text for f, snippet in ALLOWED_DIVISIONS):
                        problems.append(f"{where}: '{text}' divides by a VAE stride; use wan/geometry.py")
            if _stride_product(node) and not owner:
                text = ast.get_source_segment(source, node) or ""
                problems.append(f"{where}: '{text}' multiplies by a VAE stride; use video_frames / pixel_size "
                                "(or VAE_STRIDE_T / VAE_STRIDE_S) from wan/geometry.py")
            if _is_seed_power(node) and not owner:
                problems.append(f"{where}: 2**64 written again; import MAX_SEED / check_seed from wan/geometry.py")
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and not owner:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name) and target.id in GEOMETRY_NAMES:
                        problems.append(f"{where}: {target.id} defined again; import it from wan/geometry.py")
            if isinstance(node, ast.FunctionDef) and node.name in GEOMETRY_FUNCTIONS and not owner:
                if not isinstance(getattr(node, "parent", None), ast.ClassDef):
                    problems.append(f"{where}: def {node.name} again; wan/geometry.py has it")
            if isinstance(node, ast.arguments):
                defaults = dict(zip([a.arg for a in node.args[len(node.args) - len(node.defaults):]], node.defaults))
                defaults.update({a.arg: d for a, d in zip(node.kwonlyargs, node.kw_defaults) if d is not None})
                for name, default in defaults.items():
                    if (name in ("max_len", "text_len", "text_tokens") and isinstance(default, ast.Constant)
                            and default.value == 512):
                        problems.append(f"{where}: {name}=512 written again; default to wan.geometry.MAX_TOKENS")
            values = _literal(node)
            if values is not None:
                for choices, home in CHOICE_LISTS.items():
                    if values == choices and rel != home:
                        problems.append(f"{where}: the list {choices} written again; import it from {home}")
        for node in ast.walk(tree):  # text_len: int = 512 in a dataclass
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and node.target.id in ("text_len", "max_len", "text_tokens") and isinstance(node.value, ast.Constant)
                    and node.value.value == 512):
                problems.append(f"{rel}:{node.lineno}: {node.target.id} = 512 written again; use MAX_TOKENS")
    return problems


def _mark_parents(tree: ast.AST) -> None:
    for parent in ast.walk(tree):
        for child in ast.iter_child_nodes(parent):
            child.parent = parent  # type: ignore[attr-defined]


def test_every_geometry_fact_has_one_owner() -> None:
    problems = find_problems(ROOT)
    assert not problems, "\n".join(problems)


def test_the_scan_finds_each_kind_of_copy(tmp_path: Path) -> None:
    (tmp_path / "wan").mkdir()
    (tmp_path / "wan" / "geometry.py").write_text("VAE_STRIDE_T = 4\ndef latent_frames(f):\n    return (f - 1) // 4 + 1\n")
    (tmp_path / "nodes").mkdir()
    (tmp_path / "nodes" / "x.py").write_text(
        "TEMPORAL_FACTOR = 4\n"
        "MAX_TOKENS = 512\n"
        "SEED = 2**64 - 1\n"
        "def latent_frames(frames):\n    return (frames - 1) // 4 + 1\n"
        "def f(height, width, max_len=512):\n    return height // 8, width // 8\n"
        "SAMPLERS = ('unipc', 'euler')\n"
        "KEYS = 'wasdijkl'\n"
        "class C:\n    text_len: int = 512\n"
        "def back(latent, frames, h, g):\n"
        "    return (frames - 1) * 4 + 1, 1 + 4 * (latent.shape[1] - 1), 8 * h, latent.shape[2] * 8, 4 * g + 1\n"
    )
    # Byte counts, a float, products that are not sizes: no stride.
    (tmp_path / "nodes" / "bytes.py").write_text(
        "def size(latent, out_f, frames, h):\n"
        "    return latent.numel() * 4, 4 * out_f, 4.0 * frames, 8 * (h + 1), 2 * h\n")
    found = "\n".join(find_problems(tmp_path))
    for needle in ("TEMPORAL_FACTOR defined again", "MAX_TOKENS defined again", "2**64 written again",
                   "def latent_frames again", "'(frames - 1) // 4'", "'height // 8'", "'width // 8'",
                   "max_len=512", "('unipc', 'euler')", "('wasdijkl',)", "text_len = 512", "'(frames - 1) * 4'",
                   "'4 * (latent.shape[1] - 1)'", "'8 * h'", "'latent.shape[2] * 8'", "'4 * g'"):
        assert needle in found, f"{needle!r} not reported in:\n{found}"
    assert "nodes/bytes.py" not in found
    assert not any(line.startswith("wan/geometry.py") for line in found.splitlines())  # the owner is never reported
