// trisque dashboard: the little JavaScript the server-rendered pages need (no libraries).
"use strict";

(function () {
  const REFRESH_MS = 2000;

  // "running for" cells count on between two renders: the server gave the time elapsed when
  // it rendered the cell (data-ms); the browser adds its own time since it first saw it.
  function duration(ms) {
    const s = ms / 1000;
    if (s < 60) return s < 10 ? `${s.toFixed(1)} s` : `${Math.round(s)} s`;
    const m = Math.floor(s / 60);
    if (m < 60) return `${m} min ${Math.floor(s % 60)} s`;
    const h = Math.floor(m / 60);
    return h < 48 ? `${h} h ${m % 60} min` : `${Math.floor(h / 24)} d ${h % 24} h`;
  }
  const seen = new WeakMap();
  setInterval(() => {
    for (const cell of document.querySelectorAll(".elapsed[data-ms]")) {
      if (!seen.has(cell)) seen.set(cell, performance.now());
      cell.textContent = duration(Number(cell.dataset.ms) + performance.now() - seen.get(cell));
    }
  }, 1000);

  // Every state-changing request carries the page's token (the API refuses a browser's
  // without it: a page of another site cannot read it).
  const csrf = document.querySelector('meta[name="csrf-token"]');
  const CSRF = { "X-CSRF-Token": csrf ? csrf.content : "" };

  function flash(text, isError) {
    const box = document.getElementById("flash");
    if (!box) return;
    box.textContent = text;  // text, never HTML
    box.className = isError ? "error" : "";
    box.hidden = false;
  }

  // The overview: fetch the server-rendered <main> again every 2 s and swap it in.
  const main = document.querySelector("main[data-refresh]");
  if (main) {
    let busy = false;
    async function refresh() {
      if (busy || document.hidden) return;
      busy = true;
      try {
        const r = await fetch(main.dataset.refresh, { cache: "no-store" });
        if (r.ok) main.innerHTML = await r.text();
      } catch (e) {
        // the node is restarting or unreachable: try again at the next tick
      } finally {
        busy = false;
      }
    }
    setInterval(refresh, REFRESH_MS);

    // Delete buttons of dead letters and failed jobs (DELETE /messages/<id>: ACKJOB).
    main.addEventListener("click", async (ev) => {
      const button = ev.target.closest("button[data-delete]");
      if (!button) return;
      button.disabled = true;
      try {
        const r = await fetch(button.dataset.delete, { method: "DELETE", headers: CSRF });
        const body = r.status === 204 ? {} : await r.json().catch(() => ({}));
        flash(r.ok ? "Deleted." : `Delete failed: ${body.error || r.status}`, !r.ok);
      } catch (e) {
        flash(`Delete failed: ${e}`, true);
      }
      await refresh();
    });

    // Redrive buttons (delegated: the sections are replaced at every refresh).
    main.addEventListener("click", async (ev) => {
      const button = ev.target.closest("button[data-redrive]");
      if (!button) return;
      button.disabled = true;
      try {
        const r = await fetch(button.dataset.redrive, {
          method: "POST", headers: { "Content-Type": "application/json", ...CSRF }, body: "{}",
        });
        const body = await r.json().catch(() => ({}));
        if (r.ok) {
          flash(`Moved ${body.moved} dead letter${body.moved === 1 ? "" : "s"} back to their queues.`, false);
        } else {
          flash(`Redrive failed: ${body.error || r.status}`, true);
        }
      } catch (e) {
        flash(`Redrive failed: ${e}`, true);
      }
      await refresh();
    });
  }

  // A job's page: its output as Server-Sent Events. The server sends HTML it escaped itself
  // (node/ansi.py), and the run's panel rendered by the same templates as the page.
  const log = document.getElementById("log");
  if (log && log.dataset.stream) {
    const state = document.getElementById("log-state");
    const panel = document.getElementById("run-panel");
    const source = new EventSource(log.dataset.stream);
    const atBottom = () => log.scrollHeight - log.scrollTop - log.clientHeight < 40;
    source.addEventListener("open", () => { state.textContent = "live"; });
    source.addEventListener("output", (ev) => {
      const follow = atBottom();
      log.insertAdjacentHTML("beforeend", ev.data);
      if (follow) log.scrollTop = log.scrollHeight;
    });
    source.addEventListener("status", (ev) => { panel.innerHTML = ev.data; });
    source.addEventListener("job", (ev) => {
      document.getElementById("job-panel").innerHTML = ev.data;
    });
    source.addEventListener("end", (ev) => {
      source.close();
      state.textContent = ev.data ? `ended: ${ev.data}` : "ended";
      log.dataset.ended = ev.data || "gone";
    });
    source.addEventListener("error", () => {
      if (source.readyState !== EventSource.CLOSED) state.textContent = "reconnecting…";
    });
  }
})();
