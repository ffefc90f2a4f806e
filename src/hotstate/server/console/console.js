// hotstate console: polls this server's JSON API once a second and draws servers by rack, each table's
// partitions x servers, rates and recent events; and follows one table's changes live over Server-Sent
// Events (GET /v1/tables/{t}/changes: EventSource resumes from the last event's id when it reconnects). Everything from the API goes into the page as text
// (textContent, createTextNode, setAttribute on fixed attribute names): never as HTML.
"use strict";

const POLL_MS = 1000;
const EVENTS_SHOWN = 200;
const ROWS_SHOWN = 256;
const CHANGES_SHOWN = 100;

const state = {
  lastSeq: 0,
  events: [],
  failures: 0,
  cluster: null,
};

// ------------------------------------------------------------------ DOM helpers

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "class") node.className = value;
    else node.setAttribute(name, String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function byId(id) {
  return document.getElementById(id);
}

// ------------------------------------------------------------------ formatting

function fmtCount(n) {
  if (n === null || n === undefined) return "–";
  if (Math.abs(n) >= 1e6) return (n / 1e6).toFixed(1) + "M";
  if (Math.abs(n) >= 1e4) return (n / 1e3).toFixed(1) + "k";
  return String(Math.round(n));
}

function fmtRate(r) {
  if (r === null || r === undefined) return "–";
  if (r >= 100) return fmtCount(r) + "/s";
  return r.toFixed(1) + "/s";
}

function fmtTime(ms) {
  const d = new Date(ms);
  return d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false });
}

function plural(n, word) {
  return n + " " + word + (n === 1 ? "" : "s");
}

// ------------------------------------------------------------------ fetching

async function getJSON(path) {
  const answer = await fetch(path, { cache: "no-store", headers: { Accept: "application/json" } });
  let body = null;
  try {
    body = await answer.json();
  } catch (_) {
    body = null;
  }
  if (!answer.ok) {
    const why = body && typeof body.message === "string" ? body.message : answer.statusText;
    throw new Error(path + ": " + answer.status + " " + why);
  }
  return body;
}

async function poll() {
  try {
    const [cluster, lag, rates, events] = await Promise.all([
      getJSON("/v1/cluster"),
      getJSON("/v1/lag"),
      getJSON("/v1/cluster/rates"),
      getJSON("/v1/events?after=" + state.lastSeq + "&limit=" + EVENTS_SHOWN),
    ]);
    // Tables only once the server's metadata has caught up (it answers 503 until then).
    const tables = cluster.ready ? await getJSON("/v1/tables") : null;
    takeEvents(events);
    if (tables) liveTables(tables.tables);
    state.cluster = cluster;
    state.failures = 0;
    render(cluster, tables, lag, rates);
    setPulse("live", "live · " + fmtTime(cluster.time_ms));
    setBanner(cluster.ready ? null : "server " + cluster.server + " is starting: its metadata has not caught up yet");
  } catch (error) {
    state.failures += 1;
    setPulse("lost", "no answer");
    const who = state.cluster ? "server " + state.cluster.server : "this server";
    setBanner("Lost contact with " + who + " (" + error.message + "); retrying. Another server's console: see the links on its card.");
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

function takeEvents(answer) {
  if (answer.latest_seq < state.lastSeq) state.events = []; // the server restarted: a new log
  for (const event of answer.events) state.events.push(event);
  if (state.events.length > EVENTS_SHOWN) state.events.splice(0, state.events.length - EVENTS_SHOWN);
  state.lastSeq = answer.latest_seq;
}

function setPulse(kind, text) {
  byId("pulse").setAttribute("data-state", kind);
  byId("pulse-text").textContent = text;
}

function setBanner(text) {
  const banner = byId("banner");
  banner.hidden = text === null;
  banner.textContent = text || "";
}

// ------------------------------------------------------------------ rendering

function render(cluster, tables, lag, rates) {
  const byServer = new Map(rates.rates.map((r) => [r.server, r]));
  renderSummary(cluster, tables, rates);
  renderRacks(cluster, byServer);
  renderTables(cluster, tables, lag, rates);
  renderEvents();
}

function renderSummary(cluster, tables, rates) {
  const sum = (field) => rates.rates.reduce((acc, r) => acc + (r[field] || 0), 0);
  const up = cluster.servers.filter((s) => s.state === "up").length;
  const partitions = tables ? tables.tables.reduce((acc, t) => acc + t.partitions, 0) : null;
  const items = [
    ["cluster", cluster.cluster_id],
    ["servers up", up + " / " + cluster.servers.length],
    ["controller leader", cluster.controller_leader === null ? "none (election)" : "server " + cluster.controller_leader],
    ["tables", tables ? String(tables.tables.length) : "–"],
    ["partitions", partitions === null ? "–" : String(partitions)],
    ["queries", fmtRate(sum("queries_per_s"))],
    ["rows written", fmtRate(sum("rows_written_per_s"))],
    ["page from", "server " + cluster.server],
  ];
  byId("summary").replaceChildren(
    ...items.map(([name, value]) => el("div", { "data-stat": name }, el("dt", {}, name), el("dd", {}, value)))
  );
}

function serverOrder(servers) {
  return [...servers].sort((a, b) => {
    const ra = a.rack === null ? "~" : a.rack;
    const rb = b.rack === null ? "~" : b.rack;
    return ra < rb ? -1 : ra > rb ? 1 : a.node_id - b.node_id;
  });
}

function renderRacks(cluster, rates) {
  const racks = new Map();
  for (const server of serverOrder(cluster.servers)) {
    const rack = server.rack === null ? "no rack" : server.rack;
    if (!racks.has(rack)) racks.set(rack, []);
    racks.get(rack).push(server);
  }
  const columns = [];
  for (const [rack, servers] of racks) {
    columns.push(
      el(
        "section",
        { class: "rack", "data-rack": rack },
        el("h3", {}, "rack " + rack),
        servers.map((s) => serverCard(s, cluster, rates.get(s.node_id)))
      )
    );
  }
  byId("racks").replaceChildren(...columns);
}

function serverCard(server, cluster, rates) {
  const since = server.state === "up" ? null : server.state + " since " + fmtTime(server.status_since_ms);
  const link = consoleLink(server, cluster);
  const rateNote = rates && rates.error ? rates.error : null;
  return el(
    "article",
    {
      class: "server",
      "data-server": server.node_id,
      "data-state": server.state,
      "data-leader": server.controller_leader ? "true" : "false",
    },
    el(
      "div",
      { class: "server-head" },
      el("span", { class: "server-name" }, "server " + server.node_id),
      el("span", { class: "pill state-" + server.state }, server.state),
      server.fenced && server.state === "down" ? el("span", { class: "pill state-fenced" }, "fenced") : null,
      server.draining ? el("span", { class: "pill state-draining", title: "being removed: its replicas move to the other servers" }, "draining") : null,
      server.controller_leader ? el("span", { class: "badge leader", title: "metadata quorum leader, epoch " + cluster.controller_epoch }, "controller leader") : null,
      server.node_id === cluster.server ? el("span", { class: "badge here" }, "this page") : null
    ),
    el(
      "dl",
      { class: "server-stats" },
      stat("actives", fmtCount(server.actives)),
      stat("standbys", fmtCount(server.standbys)),
      stat("warmups", fmtCount(server.warmups)),
      stat("queries", rates ? fmtRate(rates.queries_per_s) : "–"),
      stat("rows written", rates ? fmtRate(rates.rows_written_per_s) : "–"),
      stat("roles", server.roles.join(", "))
    ),
    el(
      "div",
      { class: "server-foot" },
      since ? el("span", {}, since) : null,
      el("span", {}, "rpc " + server.rpc),
      link,
      rateNote && server.state === "up" ? el("span", { title: rateNote }, "rates unavailable") : null
    )
  );
}

function stat(name, value) {
  return el("div", { "data-stat": name }, el("dt", {}, name), el("dd", {}, value));
}

function consoleLink(server, cluster) {
  if (server.http === null || server.node_id === cluster.server || server.state === "down") return null;
  let url;
  try {
    url = new URL("http://" + server.http + "/ui"); // only ever an http(s) URL, whatever the string holds
  } catch (_) {
    return null;
  }
  if (url.hostname === "0.0.0.0" || url.hostname === "[::]") url.hostname = window.location.hostname;
  return el("a", { href: url.href }, "its console");
}

function renderTables(cluster, tables, lag, rates) {
  const root = byId("tables");
  if (tables === null) {
    root.replaceChildren(el("p", { class: "empty-note" }, "Tables show once this server has caught up."));
    return;
  }
  if (tables.tables.length === 0) {
    root.replaceChildren(el("p", { class: "empty-note" }, "No tables yet."));
    return;
  }
  const servers = serverOrder(cluster.servers);
  const writes = new Map();
  for (const r of rates.rates) {
    for (const [name, perS] of Object.entries(r.tables)) writes.set(name, (writes.get(name) || 0) + perS);
  }
  root.replaceChildren(...tables.tables.map((t) => tableCard(t, servers, lag.lags, writes.get(t.name))));
}

function tableCard(table, servers, lags, writesPerS) {
  const state = new Map(servers.map((s) => [s.node_id, s.state]));
  const head = el(
    "thead",
    {},
    el(
      "tr",
      {},
      el("th", { scope: "col" }, "partition"),
      servers.map((s) =>
        el(
          "th",
          { scope: "col", class: "col-" + s.state, "data-server": s.node_id },
          "server " + s.node_id,
          el("span", { class: "col-rack" }, (s.rack === null ? "no rack" : s.rack) + (s.state === "up" ? "" : " · " + s.state))
        )
      )
    )
  );
  const rows = table.placement.slice(0, ROWS_SHOWN).map((p) => {
    const warmups = new Set(p.warmups);
    const standbys = new Set(p.standbys);
    const isr = new Set(p.isr);
    return el(
      "tr",
      { "data-partition": p.partition, "data-active": p.active === null ? "none" : p.active },
      el("th", { scope: "row" }, String(p.partition), el("span", { class: "epoch", title: "leader epoch" }, "e" + p.leader_epoch)),
      servers.map((s) => {
        const role = p.active === s.node_id ? "active" : warmups.has(s.node_id) ? "warmup" : standbys.has(s.node_id) ? "standby" : null;
        if (role === null) return el("td", { class: "cell empty", "data-server": s.node_id });
        const down = state.get(s.node_id) === "down";
        const lagInfo = ((lags[String(s.node_id)] || {})[table.name] || {})[String(p.partition)];
        const offsetLag = lagInfo ? lagInfo.offset_lag : null;
        const high = offsetLag !== null && table.acceptable_lag !== null && offsetLag > table.acceptable_lag;
        const classes = ["cell", "role-" + role];
        if (!isr.has(s.node_id)) classes.push("out-of-sync");
        if (down) classes.push("on-down");
        const title = role + " on server " + s.node_id + (isr.has(s.node_id) ? ", in sync" : ", not in sync") +
          (offsetLag === null ? ", lag not reported" : ", offset lag " + offsetLag) + (down ? ", server down" : "");
        return el(
          "td",
          { class: classes.join(" "), "data-server": s.node_id, "data-role": role, title },
          el("span", { class: "role" }, role),
          el("span", { class: "lag" + (high ? " lag-high" : "") }, offsetLag === null ? "?" : fmtCount(offsetLag))
        );
      })
    );
  });
  const without = table.placement.filter((p) => p.active === null).length;
  return el(
    "section",
    { class: "table-card", "data-table": table.name },
    el(
      "div",
      { class: "table-head" },
      el("span", { class: "table-name" }, table.name),
      el(
        "span",
        { class: "table-meta" },
        el("span", {}, el("b", {}, String(table.partitions)), " partitions"),
        el("span", {}, el("b", {}, String(table.standby_replicas)), " standby each"),
        el("span", {}, "acceptable lag ", el("b", {}, table.acceptable_lag === null ? "any" : fmtCount(table.acceptable_lag))),
        el("span", {}, "rows written ", el("b", {}, fmtRate(writesPerS === undefined ? null : writesPerS))),
        el("span", {}, "last batch ", el("b", {}, table.last_batch === null ? "none" : String(table.last_batch))),
        el("span", {}, "key ", el("b", {}, table.key_columns.map((c) => c.name + " " + c.type).join(", "))),
        without > 0 ? el("span", { class: "lag-high" }, plural(without, "partition") + " without an active") : null
      )
    ),
    el("div", { class: "scroll" }, el("table", { class: "placement" }, head, el("tbody", {}, rows))),
    table.placement.length > ROWS_SHOWN
      ? el("p", { class: "more" }, "first " + ROWS_SHOWN + " of " + table.placement.length + " partitions shown")
      : null
  );
}

function renderEvents() {
  const list = byId("events");
  byId("events-hint").textContent = "as server " + (state.cluster ? state.cluster.server : "?") + " saw them, newest first";
  if (state.events.length === 0) {
    list.replaceChildren(el("li", {}, el("span", { class: "none" }, "No events since this server started.")));
    return;
  }
  const items = [...state.events].reverse().map((e) =>
    el(
      "li",
      { "data-kind": e.kind, "data-seq": e.seq },
      el("time", { datetime: new Date(e.time_ms).toISOString() }, fmtTime(e.time_ms)),
      el("span", { class: "kind kind-" + e.kind }, e.kind.replaceAll("_", " ")),
      el("span", { class: "message" }, e.message)
    )
  );
  list.replaceChildren(...items);
}

// ------------------------------------------------------------------ live changes (Server-Sent Events)

const live = { source: null, table: null, count: 0 };

function liveTables(tables) {
  const select = byId("live-table");
  const names = tables.map((t) => t.name).sort();
  const shown = [...select.options].map((o) => o.value);
  if (names.length === shown.length && names.every((n, i) => n === shown[i])) return;
  const chosen = select.value;
  select.replaceChildren(...names.map((n) => el("option", { value: n }, n)));
  if (names.includes(chosen)) select.value = chosen;
}

function liveStatus(kind, text) {
  const status = byId("live-status");
  status.setAttribute("data-state", kind);
  status.textContent = text;
}

function liveStop(why) {
  if (live.source !== null) live.source.close();
  live.source = null;
  byId("live-stop").disabled = true;
  byId("live-follow").disabled = false;
  if (why) liveStatus("stopped", why);
}

function liveFollow(event) {
  event.preventDefault();
  const table = byId("live-table").value;
  if (!table) return;
  liveStop(null);
  const params = new URLSearchParams();
  const where = byId("live-where").value.trim();
  if (where) params.set("where", where);
  params.set("snapshot", byId("live-snapshot").checked ? "true" : "false");
  live.table = table;
  live.count = 0;
  byId("live-changes").replaceChildren();
  liveStatus("connecting", "connecting to " + table + "'s changes…");
  const source = new EventSource("/v1/tables/" + encodeURIComponent(table) + "/changes?" + params.toString());
  live.source = source;
  byId("live-stop").disabled = false;
  byId("live-follow").disabled = true;
  const data = (e) => JSON.parse(e.data);
  source.addEventListener("header", (e) => {
    const header = data(e);
    liveStatus("live", "following " + header.table + (where ? " where " + where : "") + " · " + plural(header.partitions.length, "partition"));
  });
  source.addEventListener("row", (e) => {
    const row = data(e);
    liveAdd("row", row.partition, null, row.key, row.row);
  });
  source.addEventListener("change", (e) => {
    const change = data(e);
    const kind = change.row === null ? (change.left ? "left" : "delete") : "upsert";
    liveAdd(kind, change.partition, change.offset, change.key, change.row);
  });
  source.addEventListener("resync", (e) => {
    const resync = data(e);
    liveAdd("resync", resync.partition, resync.position, [], { rows: resync.rows.length });
  });
  source.addEventListener("end", (e) => {
    const end = data(e);
    if (end.final) {
      liveStop("ended: " + end.reason + " (" + end.message + ")");
    } else {
      liveStatus("connecting", "the server ended the feed (" + end.reason + "): resuming…");
    }
  });
  source.onerror = () => {
    // EventSource reconnects by itself with Last-Event-ID (a resume); a refusal closes it for good.
    if (live.source !== source) return;
    if (source.readyState === EventSource.CLOSED) liveStop("the server refused the feed (check the WHERE) or went away");
    else liveStatus("connecting", "connection lost: reconnecting…");
  };
}

function liveAdd(kind, partition, offset, key, row) {
  live.count += 1;
  const list = byId("live-changes");
  const item = el(
    "li",
    { "data-kind": kind, "data-partition": partition },
    el("time", {}, fmtTime(Date.now())),
    el("span", { class: "kind change-" + kind }, kind),
    el("span", { class: "where" }, "p" + partition + (offset === null ? "" : "@" + offset)),
    el("code", { class: "key" }, JSON.stringify(key)),
    el("code", { class: "row" }, row === null ? "" : JSON.stringify(row))
  );
  list.prepend(item);
  while (list.children.length > CHANGES_SHOWN) list.lastElementChild.remove();
  if (live.source !== null && byId("live-status").getAttribute("data-state") === "live") {
    byId("live-status").setAttribute("data-count", String(live.count));
  }
}

byId("live-form").addEventListener("submit", liveFollow);
byId("live-stop").addEventListener("click", () => liveStop("stopped"));

poll();
