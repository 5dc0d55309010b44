"""Run a command-line tool from a plain checkout: ``python <checkout> <tool> [args]``.

Tools: make_checkpoint, generate, quantize; ``--version`` prints the pack's version. Installed
copies can also use ``python -m comfyui_lingbot_world.tools.<tool>``.
"""
import difflib
import importlib
import re
import sys

from _standalone import PACKAGE, ROOT, import_pack

TOOLS = ("make_checkpoint", "generate", "quantize")
USAGE = (f"usage: python <checkout> {{{','.join(TOOLS)}}} [options]   (--help after a tool name for its "
         "options)")
HELP = (f"{USAGE}\n\n  generate         make a video from a LingBot-World package without ComfyUI\n"
        "  quantize         turn an official bf16 release into the NF4 layout, once\n"
        "  make_checkpoint  write a synthetic (random-weight) package, for tests and benchmarks")


def version() -> str:
    """The pack's version, as pyproject.toml gives it (one place)."""
    found = re.search(r'^version\s*=\s*"([^"]+)"', (ROOT / "pyproject.toml").read_text(encoding="utf-8"), re.M)
    return found.group(1) if found else "unknown"


def main() -> int:
    if sys.argv[1:2] in (["-h"], ["--help"]):
        print(HELP)
        return 0
    if sys.argv[1:2] in (["-V"], ["--version"]):
        print(f"comfyui-lingbot-world {version()}")
        return 0
    if len(sys.argv) < 2 or sys.argv[1] not in TOOLS:
        given = sys.argv[1] if len(sys.argv) > 1 else ""
        close = difflib.get_close_matches(given.lower().replace("-", "_"), TOOLS, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else ""
        print(f"error: {given!r} is not a tool{hint} (tools: {', '.join(TOOLS)}; python <checkout> --help)"
              if given else USAGE, file=sys.stderr)
        return 2
    import_pack()
    cli = importlib.import_module(f"{PACKAGE}.tools.cli")
    tool = importlib.import_module(f"{PACKAGE}.tools.{sys.argv[1]}")
    return cli.run(sys.argv[1], tool.main, sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
