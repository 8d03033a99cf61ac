"""The Docker sandbox backend: one container per sandbox, driven through the Docker Engine API.

What it is for: tasks whose workspace needs a full image — system packages, another distribution,
a language toolchain the host does not have — that the bubblewrap backend
(:mod:`horizonrl.sandbox.bwrap`, which shows the sandbox the host's own read-only ``/usr``) cannot
provide. Each sandbox is a container started from ``image`` with ``sleep infinity`` holding it open;
``exec`` is ``docker exec``.

What it needs: the Docker SDK for Python (``pip install 'docker>=7'``, imported only when a backend
is built) and a Docker Engine answering at ``DOCKER_HOST`` or the default socket. The image must
have ``sh``, GNU coreutils (``timeout``, ``realpath``, ``stat``) and **git**: ``python:3.11``
(the default) has them; ``python:3.11-slim`` has no git — build ``FROM python:3.11-slim`` plus
``apt-get install -y git`` for a small image.

How a sandbox is built (:meth:`.backend.DockerBackend.create`): ``containers.run`` with the limits —
``mem_limit``/``memswap_limit`` (``memory_mib``, no swap), ``pids_limit`` (``processes``), ulimits
``cpu`` (``cpu_s``) and ``fsize`` (``file_size_mib``), a tmpfs ``/tmp`` of ``tmp_mib``, no network
unless ``network=True``, ``init`` to reap orphans, label ``horizonrl.sandbox=1``; the template
directory is copied into ``/workspace`` with ``put_archive`` (files owned by root), and
``/workspace`` becomes a git repository whose first commit is the template (a template that is a git
repository already keeps its own history, as in bwrap). That commit is the base of
:meth:`.sandbox.DockerSandbox.diff`.

Same contract as bwrap: ``exec`` runs ``sh -c CMD`` in /workspace (as ``timeout -s KILL T sh -c
CMD``), each stream is cut to ``output_bytes`` keeping the head and the tail around a ``[... N bytes
cut ...]`` marker, a timeout kills the command (exit 137, ``timed_out=True``); ``read_file`` and
``write_file`` resolve the path inside the container (``realpath -m``, after symlinks) and refuse
anything outside /workspace; ``diff`` is ``git diff --binary`` against the base, new files included.

How it differs from bwrap:

* Isolation is the container runtime's (namespaces, cgroups, seccomp, no-new-privileges), not
  bubblewrap's; the container runs as the image's user (root in most images) with Docker's
  default capabilities.
* Creating a sandbox costs a container start and a copy of the whole template (bwrap overlays it),
  so large templates are slower and the template is held in memory as a tar while it is copied.
* ``docker exec`` returns only when every holder of the command's stdout/stderr has closed it: a
  background process must redirect its output (``cmd >/tmp/log 2>&1 &``) or the exec waits for it
  until the timeout kills it. Background processes that do redirect keep running between calls.
* The whole output of a command crosses from the engine before it is cut (bwrap cuts it while it
  streams and kills a command that floods); the timeout bounds it.
* Cancelling an ``exec`` (e.g. an episode's timeout) stops waiting for it but does not kill the
  command: it runs on until its own timeout, or until :meth:`.sandbox.DockerSandbox.close` removes the
  container.
* ``write_file`` writes through the engine, so ``fsize`` does not apply to it: data larger than
  ``file_size_mib`` is refused up front instead.
* A crashed trainer leaves its containers behind; remove them with
  ``docker rm -f $(docker ps -aq --filter label=horizonrl.sandbox=1)``.

Where each job lives:

=================  =====================================================================================
``backend``        :class:`.backend.DockerBackend`: starting a container per sandbox, the template copied in
``sandbox``        :class:`.sandbox.DockerSandbox`: exec, files, diff, close
=================  =====================================================================================
"""
