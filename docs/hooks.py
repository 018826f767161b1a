"""MkDocs hooks: the pages written from code rather than by hand.

- ``commands/*.md``: one page per ``calibkit`` command, rendered from its typer definition (usage, the help
  text, every argument and option with its type and default), and ``commands/index.md`` listing them with their
  one-line summaries. A command added to the CLI gets its page and its nav entry without touching the docs.
- ``measured.md``: the ``<!-- measured:generated -->`` marker is replaced by the demo's measured rows, rendered
  by ``tools/readme_measured.py`` (the tool that writes the README's block) from the summary ``calibkit demo
  run`` wrote when there is one, else read from the README's block, with the commit it comes from.
- Docstrings' cross-references (``:func:`x```, ``:class:`~a.B```, the roles the code's docstrings use) render
  as the name in code, not as literal role markers (mkdocstrings' Google style does not read them).

Registered in ``mkdocs.yml`` under ``hooks:``; ``tests/test_docs.py`` builds the site with ``--strict``.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the calibkit of this checkout, whatever is installed
    sys.path.insert(0, str(ROOT))

COMMANDS_NAV = "Commands"
MEASURED_MARKER = "<!-- measured:generated -->"


# --- command pages -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CommandPage:
    path: tuple[str, ...]  # ("demo", "prepare")
    command: Any  # the click command typer builds
    context: Any  # its click context, for the types typer shows

    @property
    def name(self) -> str:
        return " ".join(("calibkit", *self.path))

    @property
    def uri(self) -> str:
        return f"commands/{'-'.join(self.path)}.md"


def _root_command() -> Any:
    import typer

    from calibkit.cli import app

    return typer.main.get_command(app)


def command_pages() -> list[CommandPage]:
    """Every leaf command of the CLI, in the order ``calibkit --help`` lists them."""
    root = _root_command()
    context = _context_class(root)

    def walk(cmd: Any, path: tuple[str, ...], parent: Any) -> Iterator[CommandPage]:
        ctx = context(cmd, info_name=path[-1] if path else "calibkit", parent=parent)
        subs = getattr(cmd, "commands", None)
        if not subs:
            yield CommandPage(path, cmd, ctx)
            return
        for name, sub in subs.items():
            if not getattr(sub, "hidden", False):
                yield from walk(sub, (*path, name), ctx)

    return list(walk(root, (), None))


def _context_class(cmd: Any) -> Any:
    return getattr(cmd, "context_class", None) or __import__("typer").core._click.Context


def _unescape(text: str | None) -> str:
    """Help texts are escaped for rich at registration (``\\[`` shows a bracket); the docs want them plain."""
    return (text or "").replace("\\[", "[")


_MD_SPECIAL = re.compile(r"([\\*_\[\]#|])")


def md_text(text: str, table: bool = False) -> str:
    """Markdown for a plain help text: `code spans` kept as they are, everything else escaped so that
    ``<script>``, ``*``, ``_`` and brackets show as written. ``table``: pipes inside code spans escaped too."""
    parts = text.split("`")
    if len(parts) % 2 == 0:  # an unpaired backtick is text
        parts = [*parts[:-2], parts[-2] + "\\`" + parts[-1]]
    out = []
    for i, part in enumerate(parts):
        if i % 2:
            out.append("`" + (part.replace("|", "\\|") if table else part) + "`")
        else:
            part = part.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            out.append(_MD_SPECIAL.sub(r"\\\1", part))
    return "".join(out)


def help_markdown(text: str) -> str:
    """A command's help as Markdown: prose paragraphs as text, indented example lines as one bash block."""
    blocks: list[str] = []
    code: list[str] = []

    def flush() -> None:
        if code:
            blocks.append("```bash\n" + "\n".join(code) + "\n```")
            code.clear()

    for para in inspect.cleandoc(_unescape(text)).split("\n\n"):
        lines = [ln for ln in para.replace("\b", "").split("\n") if ln.strip()]
        if not lines:
            continue
        if all(ln.startswith("  ") for ln in lines):
            code.extend(ln[2:] for ln in lines)
            continue
        flush()
        blocks.append(md_text(" ".join(ln.strip() for ln in lines)))
    flush()
    return "\n\n".join(blocks)


def _is_flag(param: Any) -> bool:
    return bool(getattr(param, "is_flag", False))


def _type(param: Any, ctx: Any) -> str:
    if _is_flag(param):
        return "flag"
    shown = param.display_type(ctx) if hasattr(param, "display_type") else str(param.type)
    shown = shown.strip("<>") if isinstance(shown, str) else str(shown)
    rng = getattr(param, "_get_number_range_help_str", None)
    limits = rng() if callable(rng) else None
    return shown.replace(" range", "") + (f" ({limits})" if limits else "")


def _default(param: Any) -> str:
    if param.required:
        return "required"
    value = param.default
    if value is None or value == [] or value == ():
        return "—"
    if _is_flag(param):
        if param.secondary_opts:  # --x/--no-x: the one that applies by default
            return param.opts[0] if value else param.secondary_opts[0]
        return "off" if not value else "on"
    value = getattr(value, "value", value)  # enums
    return f"`{value}`"


def _names(param: Any) -> str:
    names = [*param.opts, *param.secondary_opts]
    return ", ".join(f"`{n}`" for n in names)


def _usage(page: CommandPage) -> str:
    pieces = [page.name, "[OPTIONS]"]
    for p in page.command.params:
        if getattr(p, "param_type_name", "") != "argument":
            continue
        shown = (p.metavar or p.name or "").upper()
        shown += "..." if p.nargs != 1 else ""
        pieces.append(shown if p.required else f"[{shown}]")
    return " ".join(pieces)


def render_command(page: CommandPage) -> str:
    cmd, ctx = page.command, page.context
    lines = [f"# `{page.name}`", ""]
    if cmd.short_help:
        lines += [f"**{md_text(_unescape(cmd.short_help))}**", ""]
    lines += ["```text", _usage(page), "```", "", help_markdown(cmd.help or ""), ""]
    arguments = [p for p in cmd.params if getattr(p, "param_type_name", "") == "argument"]
    options = [p for p in cmd.params if getattr(p, "param_type_name", "") == "option" and not p.hidden]
    if arguments:
        lines += ["## Arguments", "", "| argument | type | description |", "|---|---|---|"]
        for p in arguments:
            name = (p.metavar or p.name or "").upper()
            lines.append(f"| `{name}` | {_type(p, ctx)} | {md_text(_unescape(p.help), table=True)} |")
        lines.append("")
    lines += ["## Options", "", "| option | type | default | description |", "|---|---|---|---|"]
    for p in options:
        lines.append(f"| {_names(p)} | {_type(p, ctx)} | {_default(p)} | {md_text(_unescape(p.help), table=True)} |")
    lines += ["| `--help` | flag | off | Show the help and exit. |", ""]
    lines += [f"Generated from the command's definition (`calibkit/cli/`); `{page.name} --help` prints the same "
              "text in the terminal. [Global options and exit codes](index.md)."]
    return "\n".join(lines) + "\n"


def render_index(pages: list[CommandPage]) -> str:
    root = _root_command()
    ctx = _context_class(root)(root, info_name="calibkit")
    lines = [
        "# Commands", "",
        "Every page below is generated from the command's own definition when the site is built, so it says what "
        "`calibkit COMMAND --help` says.", "",
        "| command | what it does |", "|---|---|",
    ]
    for page in pages:
        link = page.uri.removeprefix("commands/")
        lines.append(f"| [`{page.name}`]({link}) | {md_text(_unescape(page.command.short_help or ''), table=True)} |")
    lines += ["", "## Global options", "", "Given before the command: `calibkit --verbose calibrate ...`.", "",
              "| option | type | description |", "|---|---|---|"]
    for p in root.params:
        if getattr(p, "param_type_name", "") == "option" and not p.hidden:
            lines.append(f"| {_names(p)} | {_type(p, ctx)} | {md_text(_unescape(p.help), table=True)} |")
    lines += ["", "## Exit codes", "",
              "Every failure is one `error:` line and one `hint:` line on stderr, never a traceback (unless "
              "`--verbose` or `CALIBKIT_TRACEBACK=1`).", "",
              "| code | meaning |", "|---|---|"]
    lines += [f"| {code} | {meaning} |" for code, meaning in _exit_codes()]
    return "\n".join(lines) + "\n"


def _exit_codes() -> list[tuple[int, str]]:
    """The exit codes of the error tree (errors.py), with the two the CLI adds for signals."""
    from calibkit import errors

    seen: dict[int, str] = {0: "success", 1: "an unexpected error (a calibkit bug: please report it)"}
    for cls in (errors.UsageError, errors.DataError, errors.ModelError, errors.CalibrationError,
                errors.BackendError, errors.MissingDependencyError, errors.TargetMissedError):
        meaning = (cls.__doc__ or cls.__name__).strip().splitlines()[0].rstrip(".")
        seen.setdefault(int(cls.exit_code), f"`{cls.__name__}`: {md_text(meaning, table=True)}")
    seen[2] = seen.get(2, "") + "; also an operating-system error no check caught (a full disk, a permission)"
    seen[130] = "interrupted (Ctrl-C); temporary outputs removed"
    seen[143] = "terminated (SIGTERM); temporary outputs removed"
    return sorted(seen.items())


# --- measured page -------------------------------------------------------------------------------------------


def _tool() -> Any:
    spec = importlib.util.spec_from_file_location("readme_measured", ROOT / "tools" / "readme_measured.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def _block_commit(readme: Path, begin: str, end: str) -> str:
    """The newest commit among the README block's lines: the commit that last regenerated it."""
    out = _git("blame", "-M", "--line-porcelain", "-L", f"/{re.escape(begin)}/,/{re.escape(end)}/", "--", readme.name)
    if out is None:
        return "an unknown commit (no git history here)"
    newest: tuple[int, str] = (-1, "")
    sha = ""
    for line in out.splitlines():
        if re.fullmatch(r"[0-9a-f]{40} \d+ \d+( \d+)?", line):
            sha = line[:40]
        elif line.startswith("committer-time "):
            newest = max(newest, (int(line.split()[1]), sha))
    if not newest[1] or set(newest[1]) == {"0"}:
        return "the working tree (not committed yet)"
    return f"commit `{newest[1][:7]}`"


def measured_markdown() -> str:
    tool = _tool()
    summary = ROOT / tool.DEFAULT_SUMMARY
    if summary.is_file():
        block = tool.render_block(tool.summary_of(json.loads(summary.read_text(encoding="utf-8"))))
        head = _git("rev-parse", "--short", "HEAD")
        source = (f"Rendered when this site was built, by `tools/readme_measured.py` from `{tool.DEFAULT_SUMMARY}` "
                  f"(written by `calibkit demo run`) in a checkout of commit `{head or 'unknown'}`.")
    else:
        readme = ROOT / "README.md"
        block = tool.read_block(readme.read_text(encoding="utf-8"))
        source = (f"Copied when this site was built from the README's measured block, which `python "
                  f"tools/readme_measured.py` wrote from `{tool.DEFAULT_SUMMARY}` (`calibkit demo run`) and "
                  f"{_block_commit(readme, tool.BEGIN, tool.END)} last changed. Run `make demo` (or `calibkit "
                  f"demo run`) and rebuild the site to render it from a fresh run.")
    return f"{source}\n\n{block}\n"


# --- MkDocs events -------------------------------------------------------------------------------------------


def on_config(config: Any) -> Any:
    """The nav's "Commands" entry becomes a section: the index, then one page per command."""
    pages = command_pages()
    nav = config.get("nav") or []
    for i, item in enumerate(nav):
        if isinstance(item, dict) and COMMANDS_NAV in item:
            nav[i] = {COMMANDS_NAV: ["commands/index.md", *({p.name: p.uri} for p in pages)]}
    return config


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    pages = command_pages()
    files.append(File.generated(config, "commands/index.md", content=render_index(pages)))
    for page in pages:
        files.append(File.generated(config, page.uri, content=render_command(page)))
    return files


_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|attr|mod|data|exc|obj|const|attribute):(<code>)~?")


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    return _ROLE.sub(r"\1", html)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if MEASURED_MARKER in markdown:
        markdown = markdown.replace(MEASURED_MARKER, measured_markdown())
    return markdown
