#!/usr/bin/env bash
# The check for a machine with an NVIDIA GPU, in one command:
#
#     bash benchmarks/accelerator_check.sh [--quick] [--out DIR]
#
# For a machine where torch (with CUDA) and jax (with its CUDA plugin) are installed, there is
# no network, and this project was copied without a venv. It
#  1. makes torch_jax importable from this copy without installing or downloading anything:
#     src/ goes on PYTHONPATH, and a temporary folder on it holds the package's metadata, so
#     that `import torch` loads the backend through its entry point as an installed one does;
#  2. runs the fast test share (.ci/share, the OpInfo sweep's small share) with JAX on the GPU;
#  3. runs the benchmark suite, jax strict and fused eager on the GPU against PyTorch CUDA
#     eager and torch.compile (Inductor) on the same GPU, in one process;
#  4. writes the results under DIR (docs/benchmarks/accelerator-gpu by default): the suite's
#     README.md, results.json and chart.png (versions, device names, ratios, peak memory), and
#     check.md (versions, the tests' summary, each stage's wall time).
# Each stage has a time limit (SIGINT: the tests print their summary, the suite writes the
# workloads it finished), so the whole check ends within 8 minutes. Where there is no GPU
# it runs the same stages with JAX on the CPU and PyTorch CPU eager and Inductor as the
# reference (DIR defaults to docs/benchmarks/accelerator-cpu): CI runs it so, with --quick
# (one test file; two workloads, short repeats, no Inductor), so that it cannot rot.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
python=${PYTHON:-python3}
quick=0
out=""
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) quick=1 ;;
        --out) out=$2; shift ;;
        *) echo "usage: bash benchmarks/accelerator_check.sh [--quick] [--out DIR]" >&2; exit 2 ;;
    esac
    shift
done
start=$(date +%s)
elapsed() { echo $(($(date +%s) - start)); }

# 1. importable without installing: the package's metadata beside src/ (entry point included)
site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
version=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
meta="$site/torch_jax-$version.dist-info"
mkdir -p "$meta"
printf 'Metadata-Version: 2.1\nName: torch_jax\nVersion: %s\n' "$version" >"$meta/METADATA"
printf '[torch.backends]\ntorch_jax = torch_jax:_autoload\n\n[torch_dynamo_backends]\njax = torch_jax.compile:backend\n' >"$meta/entry_points.txt"
export PYTHONPATH="$root/src:$site:$root${PYTHONPATH:+:$PYTHONPATH}"

# which platform: the GPU where torch sees CUDA and JAX has its CUDA plugin
if TORCH_DEVICE_BACKEND_AUTOLOAD=0 "$python" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null &&
    JAX_PLATFORMS=cuda "$python" -c "import jax; jax.devices()" >/dev/null 2>&1; then
    platform=gpu
    export JAX_PLATFORMS=cuda
    variants=cuda,cuda_inductor,strict,fused,compiled
    workers=8
else
    platform=cpu
    export JAX_PLATFORMS=cpu
    variants=cpu,inductor,strict,fused,compiled
    workers=2
fi
out=${out:-docs/benchmarks/accelerator-$platform}
mkdir -p "$out"
echo "accelerator check: JAX on the $platform, results in $out"
"$python" - "$out/versions.txt" <<'EOF'
import importlib.metadata as m, platform, sys, torch, jax
import torch_jax  # (through the entry point already, when import torch loaded it)
lines = [f"python {platform.python_version()}", f"torch {torch.__version__}", f"jax {jax.__version__}"]
for name in ("jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin"):
    try:
        lines.append(f"{name} {m.version(name)}")
    except m.PackageNotFoundError:
        pass
lines.append(f"torch_jax {torch_jax.__version__} (autoloaded: {torch._C._get_privateuse1_backend_name() == 'jax'})")
lines.append(f"jax device: {jax.devices()[0].device_kind} ({jax.devices()[0].platform}), {jax.device_count()} of them")
if torch.cuda.is_available():
    lines.append(f"PyTorch CUDA device: {torch.cuda.get_device_name(0)}")
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
[ $? -eq 0 ] || { echo "accelerator check: torch_jax does not import here" >&2; exit 1; }

# 2. the fast test share with JAX on this platform
mapfile -t share < <(grep -v '^#' .ci/share | sed 's/^@[0-9]* //')  # (every line: the turns are CI's)
[ $quick -eq 1 ] && share=(tests/test_errors.py)
if ! "$python" -c "import expecttest" 2>/dev/null; then  # (PyTorch's OpInfo database needs it)
    share=("${share[@]/tests\/test_opinfo.py/}")
    echo "expecttest is not installed: the OpInfo share is left out" | tee "$out/tests_left_out.txt"
fi
t0=$(elapsed)
TORCH_JAX_OPINFO=small timeout -s INT -k 20 200 "$python" -m pytest -q -n $workers -p no:cacheprovider ${share[@]} 2>&1 | tee "$out/tests.log"
tests_rc=${PIPESTATUS[0]}
tests_summary=$(tail -n 1 "$out/tests.log")
t1=$(elapsed)

# 3. the benchmark suite
[ $quick -eq 1 ] && variants=${variants/,inductor/} && variants=${variants/,compiled/}
bench_args=(--variants "$variants" --repeats 3 --out "$out")
[ $quick -eq 1 ] && bench_args+=(--quick --only "add (16" "MLP")
timeout -s INT -k 20 230 "$python" -m benchmarks "${bench_args[@]}" 2>&1 | tee "$out/benchmarks.log"
bench_rc=${PIPESTATUS[0]}
t2=$(elapsed)

# 4. what ran, in one page
{
    echo "# Accelerator check ($(date -u +%Y-%m-%d), JAX on the $platform)"
    echo
    echo '`bash benchmarks/accelerator_check.sh'"$([ $quick -eq 1 ] && echo ' --quick')"'`'
    echo
    sed 's/^/- /' "$out/versions.txt"
    echo
    echo "- tests (${share[*]}; -n $workers): $tests_summary (exit $tests_rc, $((t1 - t0)) s)"
    echo "- benchmarks (--variants $variants): exit $bench_rc, $((t2 - t1)) s; the table is in README.md"
    echo "- whole check: $(elapsed) s of wall time"
} >"$out/check.md"
cat "$out/check.md"
[ $tests_rc -eq 0 ] && [ $bench_rc -eq 0 ]
