"""Run a command-line tool from a plain checkout: ``python <checkout> <tool> [args]``.

Tools: make_checkpoint, generate, quantize. Installed copies can also use
``python -m comfyui_lingbot_world.tools.<tool>``.
"""
import importlib
import sys

from _standalone import PACKAGE, import_pack

TOOLS = ("make_checkpoint", "generate", "quantize")
USAGE = (f"usage: python <checkout> {{{','.join(TOOLS)}}} [options]   (--help after a tool name for its "
         "options)")
HELP = (f"{USAGE}\n\n  generate         make a video from a LingBot-World package without ComfyUI\n"
        "  quantize         turn an official bf16 release into the NF4 layout, once\n"
        "  make_checkpoint  write a synthetic (random-weight) package, for tests and benchmarks")


def main() -> int:
    if sys.argv[1:2] in (["-h"], ["--help"]):
        print(HELP)
        return 0
    if len(sys.argv) < 2 or sys.argv[1] not in TOOLS:
        print(USAGE, file=sys.stderr)
        return 2
    import_pack()
    cli = importlib.import_module(f"{PACKAGE}.tools.cli")
    tool = importlib.import_module(f"{PACKAGE}.tools.{sys.argv[1]}")
    return cli.run(sys.argv[1], tool.main, sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
