"""`diff --sanitize TOOL`: the same diff re-run as a child under NVIDIA compute-sanitizer, its results
document read back and the sanitizer's findings added to it."""

from __future__ import annotations

import json
import shlex

import click

from csa_conform._base.shards import Shard
from csa_conform._base.terminal import shell_join
from csa_conform.check.options import RunOptions
from csa_conform.cli.common import argv, emit_json
from csa_conform.device.sanitizer import SANITIZER, run_sanitized
from csa_conform.errors import DeviceUnavailable, SanitizedRunFailed
from csa_conform.exitcodes import ExitCode
from csa_conform.spec import STAGE_NAMES


def sanitized_diff(tool: str, options: RunOptions, stages: tuple[str, ...], case_glob: str | None,
                   shard: Shard | None, as_json: bool, git_bisect: bool) -> ExitCode:
    """The diff re-run under compute-sanitizer: its document plus the sanitizer's findings.

    The child gets --git-bisect too, so an error it stops on keeps its exit code (125 included).
    """
    words = [options.file, "--stage", "all" if stages == STAGE_NAMES else ",".join(stages), "--mode", options.mode.value,
             "--shard", str(shard or "1/1")]
    words += ["--case", case_glob] if case_glob else []
    words += ["--force-host", options.forced] if options.force_host else []
    words += options.build.words()
    words += ["--ulp", str(options.ulp), "--repeat", str(options.repeat)]
    words += ["--replay", options.replay] if options.replay else []
    words += ["--git-bisect"] if git_bisect else []
    run = run_sanitized(tool, words)
    try:
        document = json.loads(run.stdout)
    except json.JSONDecodeError:
        reason = (run.stderr.strip().splitlines() or [f"exit code {run.exit_code}"])[-1]
        raise DeviceUnavailable(f"the diff under {shlex.join(run.command[:3])} printed no results: {reason}") from None
    findings = [finding.to_dict() for finding in run.findings]
    if "error" in document and not (findings or run.error_count):
        # What the tool reported explains a child that stopped (a kernel it aborted); nothing else does.
        raise SanitizedRunFailed(f"the diff under {SANITIZER} --tool {tool} stopped: "
                                 f"{document['error']['message']}", document["exit_code"])
    code = ExitCode.DIVERGED if findings or run.error_count else ExitCode(document["exit_code"])
    document.update(argv=argv(), passed=document["passed"] and code == ExitCode.OK, exit_code=int(code))
    document["options"]["sanitize"] = tool
    reproduce = shell_join([SANITIZER, "--tool", tool, "csa-conform", "diff", *words])
    document["sanitizer"] = {"tool": tool, "reproduce": reproduce, "error_count": run.error_count,
                             "findings": findings}
    if as_json:
        emit_json(document)
        return code
    summary = document["summary"]
    click.echo(f"csa-conform diff under {SANITIZER} --tool {tool}: {summary['cases']} cases, "
               f"{summary['failed']} failed; {tool} reported {run.error_count or 0} errors")
    if "error" in document:
        click.echo(f"  the diff stopped: {document['error']['message']}")
    for finding in run.findings:
        click.echo(f"  {finding.summary()}")
    if findings:
        click.echo(f"  reproduce: {reproduce}")
    return code
