#!/usr/bin/env bash
# Make the Fruitbot GPU command carriable for one lent-GPU call, then undo it (README "Paper scale on a lent GPU"):
#   bash results/fruitbot/gpu_carry.sh hide      # before the call
#   bash results/fruitbot/gpu_carry.sh restore   # right after it, before any commit
# A lent machine receives the tracked files and the carried folders, at most 64 MiB together. procgen's wheel makes
# .whl-fruitbot/ 48 MiB, and the tracked files are 47 MiB, 42 MB of them saved agents (results/**/params_seed*.eqx)
# that a Fruitbot run never reads. `hide` takes those files out of git's index (they stay on disk, and .git/info/
# exclude keeps them out of what travels) and prints the sum that would travel; `restore` puts them back in the index
# and removes the exclude lines. Between the two, a commit would delete the saved agents from the repository:
# `hide` refuses to run with other changes staged, and `restore` is safe to run twice.
set -euo pipefail
cd "$(dirname "$0")/../.."
marker="# hidden by results/fruitbot/gpu_carry.sh"
exclude=.git/info/exclude
case ${1:-} in
  hide)
    git diff --cached --quiet || { echo "error: changes are staged; commit or unstage them before hide" >&2; exit 2; }
    grep -qxF "$marker" "$exclude" 2>/dev/null && { echo "error: already hidden; run restore first" >&2; exit 2; }
    mapfile -t params < <(git ls-files 'results/**/params_seed*.eqx')
    [ ${#params[@]} -gt 0 ] || { echo "error: no tracked params_seed*.eqx under results/" >&2; exit 2; }
    [ -s "$exclude" ] && [ -n "$(tail -c1 "$exclude")" ] && echo >> "$exclude"  # end its last line first
    { echo "$marker"; printf '/%s\n' "${params[@]}"; echo "$marker end"; } >> "$exclude"
    git rm --cached -q -- "${params[@]}"
    tracked=$(git ls-files -z | xargs -0 stat -c %s | awk '{s += $1} END {print s / 1048576}')
    carried=0
    [ -d .whl-fruitbot ] && carried=$(du -sb .whl-fruitbot | awk '{print $1 / 1048576}')
    [ -d .whl-fruitbot ] || echo "note: no .whl-fruitbot/ yet (bash results/fruitbot/gpu_wheels.sh): counted as 0"
    awk -v n=${#params[@]} -v t="$tracked" -v c="$carried" 'BEGIN {printf "hid %d parameter files; \
tracked files %.1f MiB + .whl-fruitbot/ %.1f MiB = %.1f MiB of 64%s\n", n, t, c, t + c, \
(t + c > 64 ? ": STILL TOO LARGE" : "")}'
    echo "now: the device call (carry .whl-fruitbot), then: bash results/fruitbot/gpu_carry.sh restore"
    ;;
  restore)
    if grep -qxF "$marker" "$exclude" 2>/dev/null; then
      block='$0 == m {inside = 1} inside != keep {print} $0 == m " end" {inside = 0}'
      mapfile -t params < <(awk -v m="$marker" -v keep=0 "$block" "$exclude" | grep '^/' | cut -c2-)
      awk -v m="$marker" -v keep=1 "$block" "$exclude" > "$exclude.tmp" && mv "$exclude.tmp" "$exclude"
      git reset -q -- "${params[@]}"
      echo "restored ${#params[@]} parameter files to the index"
    else
      echo "nothing hidden"
    fi
    ;;
  *) echo "usage: bash results/fruitbot/gpu_carry.sh hide|restore" >&2; exit 2 ;;
esac
