import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.launches  # every test here starts processes

SCRIPT = """
import json, resource, sys
from elmo_jax.host_memory import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
import jax, jax.numpy as jnp
f = jax.jit(lambda x: jnp.sum(jnp.tanh(jnp.outer(x, x)) @ x))  # a 64 MB temporary
x = jnp.ones(4096)
f(x).block_until_ready()
faults = []
for _ in range(12):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    f(x).block_until_ready()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps(faults))
"""


def _page_faults_per_call(mode: str) -> list[int]:
    env = {"JAX_PLATFORMS": "cpu", "PATH": ""}
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc settings")
def test_kept_memory_spares_the_page_faults_of_fresh_step_buffers():
    pages = 64 * 2**20 // 4096
    # glibc's default returns the temporary to the OS after every call: each call faults it in again.
    assert min(_page_faults_per_call("release")) > 0.9 * pages
    # Kept, calls reuse warm pages (not every call: the heap may still place a temporary anew).
    assert min(_page_faults_per_call("keep")) < 0.01 * pages


TRIM_SCRIPT = """
import json
from elmo_jax.host_memory import keep_freed_memory
assert keep_freed_memory()
import jax, jax.numpy as jnp

def rss_mib():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20

f = jax.jit(lambda x: jnp.sum(jnp.tanh(jnp.outer(x, x)) @ x))  # a 64 MB temporary, kept once freed
x = jnp.ones(4096)
f(x).block_until_ready()
f(x).block_until_ready()
kept = rss_mib()
jax.jit(lambda x: x + 1)(x).block_until_ready()  # a compile gives freed memory back
print(json.dumps([kept, rss_mib()]))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc settings")
def test_freed_memory_goes_back_to_the_os_after_a_compile():
    env = {"JAX_PLATFORMS": "cpu", "PATH": ""}
    out = subprocess.run([sys.executable, "-c", TRIM_SCRIPT], capture_output=True, text=True, check=True, env=env)
    kept, after_compile = json.loads(out.stdout.splitlines()[-1])
    assert kept - after_compile > 48  # MiB: most of the kept 64 MB temporary
