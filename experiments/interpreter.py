"""Finds a Python interpreter that has the modules an experiment needs (PyTorch, numpy).

On Debian, PyTorch and numpy come from apt (python3-torch, python3-numpy) and live in the
dist-packages of Debian's own interpreter, /usr/bin/python3. The `python3` first on PATH may
be another one (pyenv, a virtual environment, conda) that lacks them. The experiments look
in the interpreter running them first, then in /usr/bin/python3, and otherwise stop with a
message that says what to install.

Nothing here imports the modules it looks for: PyTorch must be imported only after its
thread counts are in the environment.
"""
import importlib.util
import os
import subprocess
import sys

DEBIAN_PYTHON = '/usr/bin/python3'
PACKAGES = {'torch': 'python3-torch', 'numpy': 'python3-numpy'}
_REEXEC = 'PIPETRAIN_PYTHON_REEXEC'


def _candidates(preferred=None):
    seen, out = set(), []
    for p in (preferred, sys.executable, DEBIAN_PYTHON):
        if p and p not in seen:
            seen.add(p)
            out.append(p)
    return out


def has_modules(python, modules):
    """True when `python` can find every module (without importing it)."""
    if python == sys.executable:
        return all(importlib.util.find_spec(m) is not None for m in modules)
    code = 'import importlib.util, sys; sys.exit(any(importlib.util.find_spec(m) is None ' \
           'for m in sys.argv[1:]))'
    try:
        return subprocess.run([python, '-c', code, *modules], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def missing_message(modules, tried, otherwise):
    pkgs = ' '.join(PACKAGES.get(m, 'python3-' + m) for m in modules)
    return ('%s: no Python interpreter with %s (tried %s).\n'
            'Install Debian\'s packages (they go to %s):\n'
            '    apt-get install -y --no-install-recommends %s\n'
            'or %s.'
            % (os.path.basename(sys.argv[0]), ' and '.join(modules), ', '.join(tried),
               DEBIAN_PYTHON, pkgs, otherwise))


def find_python(modules, preferred=None):
    """Path of an interpreter that has the modules: `preferred` when given (and only it),
    else this one, else /usr/bin/python3. Exits with an install hint when none has them."""
    tried = [preferred] if preferred else _candidates()
    for p in tried:
        if has_modules(p, modules):
            return p
    sys.exit(missing_message(modules, tried, 'name an interpreter that has them with --python'))


def ensure_modules(modules):
    """For a script that imports the modules itself: returns when this interpreter has
    them, else runs the script again under /usr/bin/python3 when that one has them, else
    exits with an install hint."""
    if has_modules(sys.executable, modules):
        return
    tried = _candidates()
    if not os.environ.get(_REEXEC):
        for p in tried[1:]:
            if has_modules(p, modules):
                print('(%s lacks %s: running under %s)' % (sys.executable, ', '.join(modules), p),
                      file=sys.stderr, flush=True)
                os.execve(p, [p, *sys.argv], dict(os.environ, **{_REEXEC: '1'}))
    sys.exit(missing_message(modules, tried, 'run this script with an interpreter that has them'))
