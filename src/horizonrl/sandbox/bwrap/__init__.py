"""The local sandbox backend: one bubblewrap sandbox per workspace, built by root or, rootless, by
an ordinary user in user namespaces of its own.

How a sandbox is built (``BwrapBackend.create``)::

    unshare --mount              root: a private mount namespace, gone with the sandbox
    unshare --user --map-root-user --mount
                                 rootless: a user namespace of its own (uid 0 inside is the user
                                 outside, nothing more) with a private mount namespace
      sh: join the sandbox's cgroup (where there is one), set rlimits, mount an overlay
          lower = the template (+ a cached layer holding its git repository), upper = per sandbox
          (rootless: ``userxattr``)
        [rootless: prlimit --nproc=PROCESSES, so the sandbox's own user namespace caps its processes]
          exec bwrap --unshare-all --cap-drop ALL --die-with-parent ...   (user, PID, IPC, UTS, net,
              cgroup namespaces; read-only /usr and a few /etc files; private /proc, /dev, /tmp;
              the overlay bound at /workspace)
            cat > /dev/null  (holds the namespaces while the sandbox is idle; its stdin is a pipe from
                              this process, so the sandbox ends when this process ends, however)

Each ``exec`` enters those namespaces with ``nsenter`` (like ``docker exec``), drops every
capability with ``setpriv`` and runs ``/bin/sh -c CMD`` in /workspace: processes an agent starts in
the background, files in /tmp and the workspace all persist between calls, and nothing outside the
sandbox is visible. Starting a sandbox costs the same for a 10-file and a 10,000-file template (the
overlay copies a file only when it is written), and the template is never modified.

Limits: where the sandbox has a cgroup (root: v1 or v2; rootless: a delegated v2 subtree, e.g.
systemd's ``Delegate=yes``) its processes share one memory and one process limit. Without one,
memory is RLIMIT_AS per process and, rootless, processes are capped per sandbox through
RLIMIT_NPROC, which the kernel counts per user namespace; which applies is ``SandboxInfo.limits_by``
and a one-time note on stderr. Where a cgroup is used but cannot be made or limited for a sandbox
(or, rootless, an rlimit is above the user's hard limit) the sandbox is refused
(:class:`SandboxUnavailableError`), never run without it. Every process also gets RLIMIT_CPU and
RLIMIT_FSIZE, and /tmp is a tmpfs of ``tmp_mib``. Output beyond ``output_bytes`` per stream is cut
(the head and the tail are kept, with ``truncated: true``); a command that keeps writing far past it
is killed.

``read_file``/``write_file`` resolve the path *inside* the sandbox (after symlinks) and refuse
anything outside /workspace, so neither ``..`` nor a symlink planted by the agent reaches a host file.
``diff`` is ``git diff --binary`` of the workspace (new files included) against the template's commit.

Writable layers live in a directory of the user's own (:func:`default_state_dir`), never in a
directory shared between users.

Where each job lives:

=================  =====================================================================================
``backend``        :class:`BwrapOptions` and :class:`BwrapBackend`: creating sandboxes
``sandbox``        :class:`BwrapSandbox`: exec, files, diff, the process limit reclaimed, close
``cmdline``        the command lines: bwrap's mounts and namespaces, the start-up chain, nsenter/setpriv
``command``        running one host command: output head and tail, timeout, cancellation
``cgroup``         one cgroup per sandbox, root's or in a delegated cgroup v2 (:func:`delegated_cgroup`)
``pidns``          a sandbox's processes without a cgroup: through its PID namespace
``template``       the overlay's lower layers and the base commit (:func:`prepare_template`)
``host``           the state directory, rootless mode's probe, rlimits, tools on PATH, crash leftovers
``usage``          the disk space of a writable layer (for a sandbox server's workspace quota)
=================  =====================================================================================
"""

from __future__ import annotations

from horizonrl.sandbox.bwrap.backend import START_TIMEOUT_S, BwrapBackend, BwrapOptions
from horizonrl.sandbox.bwrap.cgroup import delegated_cgroup
from horizonrl.sandbox.bwrap.cmdline import ETC_FILES, SANDBOX_ENV
from horizonrl.sandbox.bwrap.command import DRAIN_S, KILL_AFTER_FACTOR
from horizonrl.sandbox.bwrap.host import (
    default_state_dir,
    ensure_private_dir,
    reap_stale,
    rootless_problem,
)
from horizonrl.sandbox.bwrap.sandbox import BwrapSandbox
from horizonrl.sandbox.bwrap.template import prepare_template

__all__ = [
    "DRAIN_S",
    "ETC_FILES",
    "KILL_AFTER_FACTOR",
    "SANDBOX_ENV",
    "START_TIMEOUT_S",
    "BwrapBackend",
    "BwrapOptions",
    "BwrapSandbox",
    "default_state_dir",
    "delegated_cgroup",
    "ensure_private_dir",
    "prepare_template",
    "reap_stale",
    "rootless_problem",
]
