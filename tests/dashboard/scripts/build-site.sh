#!/usr/bin/env bash
# A trisque worker script for the dashboard's browser test and README screenshot: one job is
# one site to build, the job's body is the site's name. Status lines go to fd 3 (run/done).
# With BUILD_WAIT_FOR set it waits (at most 60 s) for that file before its last step, so the
# test can look at it while it runs.
set -euo pipefail
site="${TRISQUE_BODY:-unknown}"
status() { echo "run $*" >&3; }

status "fetching sources of $site"
printf '\033[1;34m==>\033[0m Fetching sources for \033[1m%s\033[0m (attempt %s)\n' "$site" "$TRISQUE_ATTEMPT"
sleep 0.2
printf '    %s\n' "git clone https://git.example.org/$site.git" "HEAD is now at 3f2c1e9 Update pricing page"
status "rendering pages"
for page in index about pricing blog/2026-11 blog/archive contact; do
  sleep 0.2
  printf '\033[32m  ✔\033[0m rendered \033[36m%-14s\033[0m %4d ms\n' "$page" $(( ${#page} * 7 + 12 ))
done
printf '\033[33mwarning:\033[0m blog/archive: 2 images without alt text\n'
status "optimising images 12/40"
printf '\033[1;34m==>\033[0m Optimising images\n'
if [ -n "${BUILD_WAIT_FOR:-}" ]; then
  for _ in $(seq 600); do [ -e "$BUILD_WAIT_FOR" ] && break; sleep 0.1; done
fi
printf '\033[32m  ✔\033[0m 40 images, 2.4 MB saved\n'
printf '\033[1;32mbuilt %s\033[0m in 3.1 s\n' "$site"
echo "done built $site" >&3
