"""`t3d ctl completion bash|zsh`: shell completion for the whole ``t3d`` command.

The script is generated from the argparse tree (`command_tree`, pure), so it offers
exactly the subcommands, flags and choices this build has: a flag's values (its choices,
or directories and files by its name), and thread ids where a command takes a THREAD
(read with ``t3d ctl threads -q --all``, passing on the --state-dir, --host and --port
typed so far). No library is needed at run time: the scripts use bash's ``complete`` and
zsh's ``compadd``/``_describe``.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Iterable
from typing import Any

import orjson

from t3d.ctl.client import EXIT_OK, CtlError, Endpoint
from t3d.ctl.terminal import out

JsonDict = dict[str, Any]

# Flags whose value is a directory or a file, by name.
_DIR_FLAGS = {"--state-dir", "--project", "--out", "--psi-root"}
_FILE_FLAGS = {"--env-file", "--replay-fixture", "--claude-bin"}
# Flags passed on to `t3d ctl threads -q` when thread ids are completed.
_CONNECTION_FLAGS = ("--state-dir", "--host", "--port")


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    completion = commands.add_parser(
        "completion",
        parents=[common],
        help="print a bash or zsh completion script for t3d",
        description="Print a completion script for t3d. bash: add `eval \"$(t3d ctl completion bash)\"` to "
        "~/.bashrc. zsh: add `eval \"$(t3d ctl completion zsh)\"` to ~/.zshrc, after compinit. "
        "With --json, the command tree the scripts are made from.",
    )
    completion.add_argument("shell", choices=("bash", "zsh"), help="the shell")
    completion.set_defaults(handler=_completion, offline=True)


# -- the tree -------------------------------------------------------------------------


def _value_kind(action: argparse.Action) -> str | list[str] | None:
    """None for a flag without a value; its choices; or "@dir", "@file", "@any"."""
    if action.nargs == 0:
        return None
    if action.choices is not None:
        return [str(choice) for choice in action.choices]
    flags = set(action.option_strings)
    if flags & _DIR_FLAGS:
        return "@dir"
    if flags & _FILE_FLAGS:
        return "@file"
    return "@any"


def command_tree(parser: argparse.ArgumentParser) -> JsonDict:
    """The parser as data: ``options`` (flag -> value kind), ``positionals`` (dest and
    choices of each), ``commands`` (name -> help, subtree)."""
    node: JsonDict = {"options": {}, "positionals": [], "commands": {}}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                node["commands"][name] = {"help": helps.get(name, ""), **command_tree(sub)}
        elif action.option_strings:
            if action.help == argparse.SUPPRESS:
                continue
            for flag in action.option_strings:
                node["options"][flag] = _value_kind(action)
        else:
            choices = [str(choice) for choice in action.choices] if action.choices is not None else None
            node["positionals"].append({"dest": action.dest, "choices": choices})
    return node


def _paths(tree: JsonDict, path: str = "") -> Iterable[tuple[str, JsonDict]]:
    yield path, tree
    for name, sub in tree["commands"].items():
        yield from _paths(sub, f"{path} {name}".strip())


def _pattern(path: str) -> str:
    """A case pattern matching exactly ``path`` ('' for the top level)."""
    return shlex.quote(path) if path else "''"


def _case_lines(tree: JsonDict, value: Any) -> list[str]:
    """``"path") echo ...;;`` lines of a bash/zsh case over every command path."""
    lines = []
    for path, node in _paths(tree):
        words = value(node)
        if words:
            lines.append(f"        {_pattern(path)}) echo {shlex.quote(' '.join(words))};;")
    return lines


def _value_lines(tree: JsonDict) -> list[str]:
    lines = []
    for path, node in _paths(tree):
        for flag, kind in sorted(node["options"].items()):
            if kind is None:
                continue
            shown = " ".join(kind) if isinstance(kind, list) else kind
            lines.append(f"        {shlex.quote(f'{path} {flag}'.strip())}) echo {shlex.quote(shown)};;")
    return lines


def _first_positional(node: JsonDict) -> list[str]:
    """What the first positional takes: thread ids (@thread), its choices, or nothing said."""
    first = node["positionals"][0] if node["positionals"] else None
    if first is None or node["commands"]:
        return []
    if first["dest"] == "thread":
        return ["@thread"]
    return list(first["choices"] or [])


def _functions(tree: JsonDict) -> str:
    """The helpers both scripts share (the syntax is common to bash and zsh)."""
    subcommands = _case_lines(tree, lambda node: sorted(node["commands"]))
    options = _case_lines(tree, lambda node: sorted(node["options"]))
    positional = _case_lines(tree, _first_positional)
    values = _value_lines(tree)
    return "\n".join(
        [
            "_t3d_subcommands() {",
            '    case "$1" in',
            *subcommands,
            "    esac",
            "}",
            "_t3d_options() {",
            '    case "$1" in',
            *options,
            "    esac",
            "}",
            "_t3d_positional() {",
            '    case "$1" in',
            *positional,
            "    esac",
            "}",
            "# The values a flag takes (choices, @dir, @file, @any); no output and status 1: it takes none.",
            "_t3d_values() {",
            '    case "${1:+$1 }$2" in',
            *values,
            "        *) return 1;;",
            "    esac",
            "}",
            "_t3d_thread_ids() {",
            '    command t3d ctl "$@" threads -q --all 2>/dev/null',
            "}",
        ]
    )


# The walk over the words typed so far: the command path, the positionals after it, and the
# connection flags to pass on. Shared by both shells (their [[ ]] and arithmetic agree).
_WALK = """\
    _t3d_path=""
    _t3d_args=0
    _t3d_conn=()
    local i=$1 word last=$2 subs
    while [ "$i" -lt "$last" ]; do
        word="${_t3d_words[i]}"
        if [[ "$word" == -* ]]; then
            if [[ "$word" != *=* ]] && _t3d_values "$_t3d_path" "$word" >/dev/null; then
                case "$word" in
                    @CONNECTION_FLAGS@) _t3d_conn+=("$word" "${_t3d_words[i+1]}");;
                esac
                i=$((i + 1))
            fi
        else
            subs=" $(_t3d_subcommands "$_t3d_path") "
            if [[ "$subs" == *" $word "* ]]; then
                _t3d_path="${_t3d_path:+$_t3d_path }$word" _t3d_args=0
            else
                _t3d_args=$((_t3d_args + 1))
            fi
        fi
        i=$((i + 1))
    done""".replace("@CONNECTION_FLAGS@", "|".join(_CONNECTION_FLAGS))


def bash_script(tree: JsonDict) -> str:
    return f"""# bash completion for t3d, generated by `t3d ctl completion bash`.
# Load it from ~/.bashrc with: eval "$(t3d ctl completion bash)"
{_functions(tree)}
_t3d_walk() {{
{_WALK}
}}
_t3d() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" prev="${{COMP_WORDS[COMP_CWORD-1]}}" values
    local -a _t3d_words=("${{COMP_WORDS[@]}}") _t3d_conn
    local _t3d_path _t3d_args
    _t3d_walk 1 "$COMP_CWORD"
    if [ "$COMP_CWORD" -gt 1 ] && [[ "$prev" == -* ]] && values="$(_t3d_values "$_t3d_path" "$prev")"; then
        case "$values" in
            @dir) COMPREPLY=($(compgen -d -- "$cur"));;
            @file) COMPREPLY=($(compgen -f -- "$cur"));;
            @any) COMPREPLY=();;
            *) COMPREPLY=($(compgen -W "$values" -- "$cur"));;
        esac
        return 0
    fi
    if [[ "$cur" == -* ]]; then
        COMPREPLY=($(compgen -W "$(_t3d_options "$_t3d_path")" -- "$cur"))
        return 0
    fi
    local words="$(_t3d_subcommands "$_t3d_path")" first="$(_t3d_positional "$_t3d_path")"
    if [ "$_t3d_args" -eq 0 ] && [ "$first" = "@thread" ]; then
        words="$words $(_t3d_thread_ids "${{_t3d_conn[@]}}")"
    elif [ "$_t3d_args" -eq 0 ]; then
        words="$words $first"
    fi
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
}}
complete -o default -F _t3d t3d
"""


def _described(tree: JsonDict) -> list[str]:
    lines = []
    for path, node in _paths(tree):
        entries = [f"{name}:{' '.join(sub['help'].split())}" for name, sub in sorted(node["commands"].items())]
        if entries:
            body = " ".join(shlex.quote(entry) for entry in entries)
            lines.append(f"        {_pattern(path)}) _t3d_described=({body});;")
    return lines


def zsh_script(tree: JsonDict) -> str:
    described = "\n".join(_described(tree))
    return f"""#compdef t3d
# zsh completion for t3d, generated by `t3d ctl completion zsh`.
# Load it from ~/.zshrc, after compinit, with: eval "$(t3d ctl completion zsh)"
{_functions(tree)}
_t3d_walk() {{
{_WALK}
}}
_t3d_describe() {{
    _t3d_described=()
    case "$1" in
{described}
    esac
}}
_t3d() {{
    local cur="${{words[CURRENT]}}" prev="${{words[CURRENT-1]}}" values opts first
    local -a _t3d_words _t3d_conn _t3d_described
    local _t3d_path _t3d_args
    _t3d_words=("${{words[@]}}")
    _t3d_walk 2 "$CURRENT"
    if (( CURRENT > 2 )) && [[ "$prev" == -* ]] && values="$(_t3d_values "$_t3d_path" "$prev")"; then
        case "$values" in
            @dir) _files -/;;
            @file) _files;;
            @any) _message 'a value';;
            *) compadd -- ${{=values}};;
        esac
        return
    fi
    if [[ "$cur" == -* ]]; then
        opts="$(_t3d_options "$_t3d_path")"
        compadd -- ${{=opts}}
        return
    fi
    _t3d_describe "$_t3d_path"
    (( ${{#_t3d_described}} )) && _describe 'command' _t3d_described
    first="$(_t3d_positional "$_t3d_path")"
    if (( _t3d_args == 0 )) && [[ "$first" == @thread ]]; then
        compadd -- ${{(f)"$(_t3d_thread_ids "${{_t3d_conn[@]}}")"}}
    elif (( _t3d_args == 0 )) && [[ -n "$first" ]]; then
        compadd -- ${{=first}}
    fi
}}
if (( $+functions[compdef] )); then
    compdef _t3d t3d
fi
"""


async def _completion(args: argparse.Namespace, endpoint: Endpoint | None) -> int:
    parser = getattr(args, "root_parser", None)
    if not isinstance(parser, argparse.ArgumentParser):
        raise CtlError("completion needs the t3d command's parser; run it as `t3d ctl completion SHELL`")
    tree = command_tree(parser)
    if args.json:
        out(orjson.dumps(tree).decode() + "\n")
    else:
        out(bash_script(tree) if args.shell == "bash" else zsh_script(tree))
    return EXIT_OK
