// qinglong-edge status console: plain browser JavaScript, no build step, no external
// resource (the Content-Security-Policy allows only this origin). The ql3c credential the
// user types lives in this closure only: never in storage, a cookie or the URL.
'use strict';
(() => {
  const ID = /^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$/;
  const TERMINAL = new Set(['succeeded', 'failed', 'cancelled', 'timed_out', 'lost']);
  const LOG_LIMIT = 2 * 1024 * 1024; // characters kept on screen; older text is dropped
  const state = { token: null, project: 'default', follow: null, timer: null, busy: false };
  const $ = (id) => document.getElementById(id);

  class ApiError extends Error {
    constructor(status, code) {
      super(code || 'http_' + status);
      this.status = status;
      this.code = code || 'http_' + status;
    }
  }

  function uuid() {
    if (crypto.randomUUID) return crypto.randomUUID();
    const b = crypto.getRandomValues(new Uint8Array(16));
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    const h = Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');
    return h.slice(0, 8) + '-' + h.slice(8, 12) + '-' + h.slice(12, 16) + '-' + h.slice(16, 20) + '-' + h.slice(20);
  }

  async function api(path, options) {
    const opts = options || {};
    const headers = { Authorization: 'Bearer ' + state.token };
    let body;
    if (opts.json !== undefined) {
      headers['Content-Type'] = 'application/json';
      body = JSON.stringify(opts.json);
    }
    const response = await fetch('/api/v3/projects/' + state.project + path, {
      method: opts.method || 'GET', headers, body, cache: 'no-store', credentials: 'omit', redirect: 'error',
    });
    let value = null;
    try { value = await response.json(); } catch (_) { value = null; }
    if (response.status >= 400 && !(opts.accept || []).includes(response.status)) {
      throw new ApiError(response.status, value && typeof value.code === 'string' ? value.code : null);
    }
    return { status: response.status, body: value };
  }

  function say(text, error) {
    const el = $('status');
    el.textContent = text;
    el.classList.toggle('error', Boolean(error));
  }

  function explain(error) {
    if (!(error instanceof ApiError)) return 'the Local API is unreachable';
    const known = {
      authentication_required: 'the credential was rejected (sign in again)',
      forbidden: 'refused: your role on this project does not allow it',
      approval_required: 'refused: this needs an approval',
      rate_limited: 'too many requests without a valid credential: wait a little',
      server_overloaded: 'the device is busy: try again',
    };
    return (known[error.code] || error.code) + ' (HTTP ' + error.status + ')';
  }

  function time(ms) {
    if (typeof ms !== 'number') return '';
    return new Date(ms).toISOString().replace('T', ' ').slice(0, 19);
  }

  function cell(row, text, cls) {
    const td = document.createElement('td');
    td.textContent = text;
    if (cls) td.className = cls;
    row.append(td);
    return td;
  }

  function button(row, label, action) {
    const td = document.createElement('td');
    const b = document.createElement('button');
    b.type = 'button';
    b.textContent = label;
    b.addEventListener('click', action);
    td.append(b);
    row.append(td);
    return b;
  }

  // Everything a job printed is text: invalid UTF-8 becomes U+FFFD (TextDecoder), control
  // characters and ANSI escapes are shown in caret notation (ESC is ^[, as cat -v does),
  // and nothing is ever parsed as HTML (text nodes only).
  function printable(text) {
    return text.replace(/[\u0000-\u0008\u000b-\u001f\u007f]/g, (c) => {
      const code = c.charCodeAt(0);
      return code === 0x7f ? '^?' : '^' + String.fromCharCode(code + 0x40);
    });
  }

  function bytes(base64) {
    const raw = atob(base64);
    const out = new Uint8Array(raw.length);
    for (let i = 0; i < raw.length; i += 1) out[i] = raw.charCodeAt(i);
    return out;
  }

  async function loadTable(id, path, key, fill) {
    const { body } = await api(path);
    const tbody = $(id).tBodies[0];
    tbody.replaceChildren();
    for (const item of body[key]) {
      const row = document.createElement('tr');
      fill(row, item);
      tbody.append(row);
    }
    return tbody;
  }

  async function loadRuns() {
    const tbody = await loadTable('runs', '/runs?limit=32', 'runs', (row, run) => {
      row.dataset.runId = run.id;
      cell(row, run.id, 'id');
      cell(row, run.taskId);
      cell(row, run.status, 's-' + run.status);
      cell(row, time(run.createdAtMs));
      cell(row, time(run.startedAtMs));
      cell(row, time(run.finishedAtMs));
      button(row, 'Log', () => follow(run.id)).className = 'follow';
    });
    if (!tbody.rows.length) {
      const row = document.createElement('tr');
      cell(row, 'no Runs yet', 'muted');
      tbody.append(row);
    }
  }

  async function loadTasks() {
    await loadTable('tasks', '/tasks?limit=64', 'tasks', (row, task) => {
      row.dataset.taskId = task.taskId;
      cell(row, task.taskId, 'id');
      cell(row, task.name);
      cell(row, String(task.revision));
      cell(row, task.enabled ? 'yes' : 'no');
      const start = button(row, 'Start', () => startTask(task.taskId));
      start.className = 'start';
      start.disabled = !task.enabled;
    });
  }

  function renderWorker(value) {
    const box = $('worker');
    box.replaceChildren();
    if (!value.configured) {
      box.textContent = 'no worker section in the configuration';
      return;
    }
    const dl = document.createElement('dl');
    const item = (name, text) => {
      const dt = document.createElement('dt');
      dt.textContent = name;
      const dd = document.createElement('dd');
      dd.textContent = text;
      dl.append(dt, dd);
    };
    const s = value.session;
    item('Session', s ? s.sessionId + ' (generation ' + s.generation + ', heartbeat ' + time(s.heartbeatAtMs) + ')'
      : 'none (the next pull registers one)');
    item('Records in flight', String(value.inFlight));
    for (const r of value.records || []) {
      item('  ' + r.offerId, r.state + (r.inFlight ? ', in flight' : '') + (r.exitCode == null ? '' : ', exit ' + r.exitCode));
    }
    const c = value.lastCycle;
    item('Last pull cycle', c ? c.status + ' at ' + time(c.atMs) : 'unknown');
    const failures = value.failures || [];
    item('Last failures', failures.length ? '' : 'none kept');
    for (const f of failures) item('  ' + time(f.atMs), f.reason + (f.detail ? ': ' + f.detail : ''));
    box.append(dl);
  }

  async function loadWorker() {
    const { body } = await api('/edge-worker');
    renderWorker(body);
  }

  async function refresh() {
    if (state.busy || !state.token) return;
    state.busy = true;
    try {
      await loadRuns();
      await loadTasks();
      await loadWorker();
    } catch (error) {
      say(explain(error), true);
      if (error instanceof ApiError && error.status === 401) signOut();
    } finally {
      state.busy = false;
    }
  }

  async function startTask(taskId) {
    try {
      const { body: task } = await api('/tasks/' + taskId);
      const { status, body } = await api('/tasks/' + taskId + '/runs', {
        method: 'POST',
        json: {
          schema: 'qinglong/task-start@v1', mutationId: uuid(),
          expectedRevision: task.task.revision, expectedContentDigest: task.task.contentDigest,
        },
      });
      say((status === 202 ? 'started Run ' : 'Run already started: ') + body.runId);
      await loadRuns();
      follow(body.runId);
    } catch (error) {
      say('start ' + taskId + ': ' + explain(error), true);
    }
  }

  async function cancelRun() {
    const job = state.follow;
    if (!job) return;
    try {
      const { body } = await api('/runs/' + job.runId + '/cancellation', {
        method: 'POST', json: { schema: 'qinglong/run-cancellation@v1', mutationId: uuid() },
      });
      say('cancel ' + job.runId + ': ' + body.status);
    } catch (error) {
      say('cancel ' + job.runId + ': ' + explain(error), true);
    }
  }

  function stopFollowing() {
    if (state.follow) state.follow.stopped = true;
    state.follow = null;
  }

  function follow(runId) {
    stopFollowing();
    const job = { runId, offset: 0, decoder: new TextDecoder('utf-8'), stopped: false, shown: 0 };
    state.follow = job;
    $('log-panel').hidden = false;
    $('log-run').textContent = runId;
    $('log').replaceChildren();
    $('log-state').textContent = 'loading';
    pump(job);
  }

  function append(job, text) {
    if (!text) return;
    const log = $('log');
    const atBottom = log.scrollTop + log.clientHeight >= log.scrollHeight - 8;
    log.append(document.createTextNode(printable(text)));
    job.shown += text.length;
    while (job.shown > LOG_LIMIT && log.firstChild) {
      job.shown -= log.firstChild.textContent.length;
      log.firstChild.remove();
    }
    if (atBottom) log.scrollTop = log.scrollHeight;
  }

  const sleep = (ms) => new Promise((resolve) => { setTimeout(resolve, ms); });

  async function pump(job) {
    let attemptId = null;
    while (!job.stopped) {
      try {
        const { body: got } = await api('/runs/' + job.runId);
        const run = got.run;
        const attempt = run.latestAttempt;
        if (!attempt) {
          $('log-state').textContent = run.status + ': no attempt yet';
          if (TERMINAL.has(run.status)) return;
          await sleep(1000);
          continue;
        }
        attemptId = attempt.id;
        let more = true;
        while (more && !job.stopped) {
          const { status, body } = await api('/runs/' + job.runId + '/attempts/' + attemptId + '/log?offset=' + job.offset,
            { accept: [410] });
          if (status === 202) { more = false; break; }
          if (status === 410) {
            $('log-state').textContent = 'log pruned by the log cap (' + body.byteLength + ' bytes, '
              + time(body.retiredAtMs) + ')';
            return;
          }
          append(job, job.decoder.decode(bytes(body.content), { stream: true }));
          job.offset = body.range.endExclusive;
          more = body.range.nextOffset !== undefined;
        }
        if (job.stopped) return;
        $('log-state').textContent = run.status + ' · attempt ' + attempt.status + ' · ' + job.offset + ' bytes';
        if (TERMINAL.has(run.status) && TERMINAL.has(attempt.status)) {
          append(job, job.decoder.decode());
          $('log-state').textContent = 'finished: ' + run.status + ' (attempt ' + attempt.status + ') · '
            + job.offset + ' bytes';
          await loadRuns();
          return;
        }
      } catch (error) {
        $('log-state').textContent = explain(error);
        if (!(error instanceof ApiError) || error.status >= 500 || error.status === 429) {
          await sleep(2000);
          continue;
        }
        return;
      }
      await sleep(1000);
    }
  }

  function signOut() {
    stopFollowing();
    state.token = null;
    if (state.timer) clearInterval(state.timer);
    state.timer = null;
    $('app').hidden = true;
    $('signin').hidden = false;
    $('who').textContent = 'not signed in';
  }

  async function signIn(event) {
    event.preventDefault();
    const project = $('project').value.trim();
    const token = $('token').value.trim();
    if (!ID.test(project)) {
      $('who').textContent = 'the project id is not valid';
      return;
    }
    state.project = project;
    state.token = token;
    $('token').value = '';
    try {
      await api('/runs?limit=1');
    } catch (error) {
      state.token = null;
      $('who').textContent = 'sign-in failed: ' + explain(error);
      return;
    }
    $('who').textContent = 'project ' + project;
    $('signin').hidden = true;
    $('app').hidden = false;
    say('signed in');
    await refresh();
    state.timer = setInterval(refresh, 5000);
  }

  document.addEventListener('DOMContentLoaded', () => {
    $('signin-form').addEventListener('submit', signIn);
    $('refresh').addEventListener('click', refresh);
    $('signout').addEventListener('click', signOut);
    $('cancel-run').addEventListener('click', cancelRun);
    $('close-log').addEventListener('click', () => { stopFollowing(); $('log-panel').hidden = true; });
  });
})();
