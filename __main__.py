"""Run a command-line tool from a plain checkout: ``python <checkout> <tool> [args]``.

Tools: make_checkpoint, generate, quantize. Installed copies can also use
``python -m comfyui_lingbot_world.tools.<tool>``.
"""
import importlib
import sys

from _standalone import PACKAGE, import_pack

TOOLS = ("make_checkpoint", "generate", "quantize")


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in TOOLS:
        print(f"usage: python <checkout> {{{','.join(TOOLS)}}} [options]   (--help after a tool name for its "
              "options)", file=sys.stderr)
        return 2
    import_pack()
    cli = importlib.import_module(f"{PACKAGE}.tools.cli")
    cli.quiet_third_party()  # before the tool imports bitsandbytes
    tool = importlib.import_module(f"{PACKAGE}.tools.{sys.argv[1]}")
    return cli.run(sys.argv[1], tool.main, sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
