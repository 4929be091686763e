// The thread list, live from subscribe.shell: every thread with its project, provider,
// status (and why it is queued), prompts waiting and last activity; filters and search.
//
// Thousands of threads: the list is virtual. Only the rows in view (and a few either side)
// exist in the DOM, absolutely placed in a spacer as tall as the whole list; row elements
// are reused as it scrolls, and a row is rewritten only when its thread changed. Updates
// are applied to the model at once and drawn once per animation frame.

import { ago, absoluteTime, h, projectName, statusText, threadTitle } from "./util.js";

export const ROW_HEIGHT = 60;
const OVERSCAN = 6;
const LIVE_MS = 200;
const STATUS_FILTERS = [
  ["active", "Active (not archived)"],
  ["waiting", "Waiting for you"],
  ["running", "Running"],
  ["queued", "Queued"],
  ["idle", "Idle"],
  ["archived", "Archived"],
  ["all", "All"],
];

/** Waiting for you first, then by last activity, newest first; ties by id (a total order). */
function order(a, b) {
  const wa = a.status === "waiting" ? 1 : 0;
  const wb = b.status === "waiting" ? 1 : 0;
  if (wa !== wb) return wb - wa;
  const ta = a.last_activity_at ?? a.created_at ?? 0;
  const tb = b.last_activity_at ?? b.created_at ?? 0;
  if (ta !== tb) return tb - ta;
  return a.id < b.id ? -1 : a.id > b.id ? 1 : 0;
}

export class ThreadList {
  constructor({ root, rpc, onCounts, onOpen }) {
    this.root = root;
    this.rpc = rpc;
    this.onCounts = onCounts || (() => {});
    this.onOpen = onOpen || (() => {});
    this.threads = new Map(); // id -> shell row (with _v, a local version)
    this.projects = new Map();
    this.prompts = new Map(); // thread id -> pending prompts
    this.providers = new Set();
    this.view = []; // the filtered, sorted rows
    this.selected = null;
    this.filters = { text: "", status: "active", project: "", provider: "" };
    this.populated = false;
    this.dirty = false;
    this.viewDirty = true;
    this.rowPool = [];
    this.version = 0;
    this._build();
  }

  _build() {
    this.search = h("input", { type: "search", id: "thread-search", placeholder: "Search threads", autocomplete: "off", "aria-describedby": "list-summary" });
    this.statusSelect = h("select", { id: "filter-status" }, ...STATUS_FILTERS.map(([v, label]) => h("option", { value: v }, label)));
    this.projectSelect = h("select", { id: "filter-project" }, h("option", { value: "" }, "All projects"));
    this.providerSelect = h("select", { id: "filter-provider" }, h("option", { value: "" }, "All providers"));
    const form = h(
      "form",
      { class: "filters", role: "search", "aria-label": "Filter threads", onsubmit: (e) => e.preventDefault() },
      h("label", { class: "search-label" }, h("span", { class: "visually-hidden" }, "Search threads"), this.search),
      h("label", null, h("span", null, "Status"), this.statusSelect),
      h("label", null, h("span", null, "Project"), this.projectSelect),
      h("label", null, h("span", null, "Provider"), this.providerSelect),
    );
    this.promptsButton = h("button", { type: "button", class: "link prompts-chip", hidden: true, onclick: () => this.setStatusFilter("waiting") });
    this.summary = h("p", { id: "list-summary", class: "list-summary" }, h("span", { class: "count" }, "Loading threads…"), " ", this.promptsButton);
    this.spacer = h("div", { class: "spacer" });
    this.viewport = h("div", { class: "list", id: "thread-list", role: "list", "aria-label": "Threads", tabindex: "-1" }, this.spacer);
    this.empty = h("p", { class: "list-empty", hidden: true });
    this.root.append(form, this.summary, this.viewport, this.empty);

    let searchTimer = 0;
    this.search.addEventListener("input", () => {
      clearTimeout(searchTimer);
      searchTimer = setTimeout(() => this._filter({ text: this.search.value.trim().toLowerCase() }), 80);
    });
    this.statusSelect.addEventListener("change", () => this._filter({ status: this.statusSelect.value }));
    this.projectSelect.addEventListener("change", () => this._filter({ project: this.projectSelect.value }));
    this.providerSelect.addEventListener("change", () => this._filter({ provider: this.providerSelect.value }));
    this.viewport.addEventListener("scroll", () => this._schedule(), { passive: true });
    this.viewport.addEventListener("keydown", (e) => this._onKey(e));
    new ResizeObserver(() => this._schedule()).observe(this.viewport);
    // Relative times ("5 min ago") age: redraw the rows in view now and then.
    setInterval(() => {
      for (const row of this.rowPool) row._key = null;
      this._schedule();
    }, 30000);
  }

  start() {
    let promptsTimer = 0;
    const refreshPrompts = () => {
      clearTimeout(promptsTimer);
      promptsTimer = setTimeout(() => this._loadPrompts(), 250);
    };
    this.sub = this.rpc.subscribe("subscribe.shell", {}, {
      onSnapshot: (snapshot) => {
        if (!this.populated) performance.mark("t3d:shell-snapshot");
        this.threads.clear();
        this.projects.clear();
        for (const p of snapshot.projects || []) this.projects.set(p.id, p);
        for (const t of snapshot.threads || []) {
          t._v = ++this.version;
          this.threads.set(t.id, t);
        }
        this._projectsChanged();
        this._providersChanged();
        this.viewDirty = true;
        this._schedule();
        this._loadPrompts();
      },
      onEvent: (event) => {
        const entity = event.entity;
        if (event.kind === "shell.updated") {
          const before = this.threads.get(entity.id);
          entity._v = ++this.version;
          this.threads.set(entity.id, entity);
          this._place(before, entity);
          if (!this.providers.has(entity.provider)) this._providersChanged();
          if ((before && before.status) !== entity.status && (entity.status === "waiting" || (before && before.status === "waiting"))) refreshPrompts();
        } else if (event.kind === "shell.removed") {
          this._place(this.threads.get(entity.id), null);
          this.threads.delete(entity.id);
          this.prompts.delete(entity.id);
        } else if (event.kind === "project.updated") {
          this.projects.set(entity.id, entity);
          this._projectsChanged();
          this.viewDirty = true; // names and paths are searched
        }
        this._scheduleLive();
      },
    });
  }

  async _loadPrompts() {
    try {
      const { requests } = await this.rpc.call("requests.pending", {});
      this.prompts.clear();
      for (const r of requests) this.prompts.set(r.thread_id, (this.prompts.get(r.thread_id) || 0) + 1);
      this._promptsDirty = true;
      for (const row of this.rowPool) row._key = null;
      this._schedule();
    } catch {
      // the list still shows who is waiting; counts come with the next change
    }
  }

  /** Prompts waiting across every thread (a thread waiting without a count yet counts one). */
  promptTotal() {
    if (this._promptsDirty) this._countPrompts();
    return this._promptTotal;
  }

  _countPrompts() {
    let total = 0;
    for (const t of this.threads.values()) {
      if (t.archived_at || t.status !== "waiting") continue;
      total += this.prompts.get(t.id) || 1;
    }
    this._promptTotal = total;
    this._promptsDirty = false;
  }

  _projectsChanged() {
    const current = this.projectSelect.value;
    const projects = [...this.projects.values()].sort((a, b) => projectName(a).localeCompare(projectName(b)));
    this.projectSelect.replaceChildren(h("option", { value: "" }, "All projects"), ...projects.map((p) => h("option", { value: p.id }, projectName(p))));
    this.projectSelect.value = this.projects.has(current) ? current : "";
  }

  _providersChanged() {
    this.providers = new Set([...this.threads.values()].map((t) => t.provider));
    const providers = [...this.providers].sort();
    const chosen = this.providerSelect.value;
    this.providerSelect.replaceChildren(h("option", { value: "" }, "All providers"), ...providers.map((p) => h("option", { value: p }, p)));
    this.providerSelect.value = providers.includes(chosen) ? chosen : "";
  }

  setStatusFilter(status) {
    this.statusSelect.value = status;
    this._filter({ status });
  }

  _filter(change) {
    Object.assign(this.filters, change);
    this.viewDirty = true;
    this.viewport.scrollTop = 0;
    this._schedule();
  }

  _matches(t) {
    const f = this.filters;
    if (f.status === "active" && t.archived_at) return false;
    if (f.status === "archived" && !t.archived_at) return false;
    if (!["active", "archived", "all"].includes(f.status) && (t.status !== f.status || t.archived_at)) return false;
    if (f.project && t.project_id !== f.project) return false;
    if (f.provider && t.provider !== f.provider) return false;
    if (f.text) {
      const project = this.projects.get(t.project_id);
      const haystack = `${t.title || ""} ${t.id} ${project ? `${projectName(project)} ${project.path}` : ""}`.toLowerCase();
      if (!haystack.includes(f.text)) return false;
    }
    return true;
  }

  _rebuildView() {
    const rows = [];
    for (const t of this.threads.values()) if (this._matches(t)) rows.push(t);
    rows.sort(order);
    this.view = rows;
    this.viewDirty = false;
    this._countPrompts();
  }

  /** One row changed (``before`` -> ``after``, either may be missing): move it in the sorted
   * view without sorting the rest. */
  _place(before, after) {
    if (before && before.status === "waiting") this._promptsDirty = true;
    if (after && after.status === "waiting") this._promptsDirty = true;
    if (this.viewDirty) return;
    if (before) {
      const index = this.view.indexOf(before);
      if (index >= 0) this.view.splice(index, 1);
    }
    if (after && this._matches(after)) {
      let low = 0;
      let high = this.view.length;
      while (low < high) {
        const mid = (low + high) >> 1;
        if (order(this.view[mid], after) <= 0) low = mid + 1;
        else high = mid;
      }
      this.view.splice(low, 0, after);
    }
  }

  /** Live updates draw at most every LIVE_MS (a list need not move at 60 frames a second);
   * what the person does (scrolling, filtering) draws at the next frame. */
  _scheduleLive() {
    if (this.liveTimer) return;
    this.liveTimer = setTimeout(() => {
      this.liveTimer = 0;
      this._schedule();
    }, LIVE_MS);
  }

  _schedule() {
    if (this.dirty) return;
    this.dirty = true;
    requestAnimationFrame(() => {
      this.dirty = false;
      this.render();
    });
  }

  render() {
    if (this.viewDirty) this._rebuildView();
    const n = this.view.length;
    const height_ = `${n * ROW_HEIGHT}px`;
    if (this.spacer.style.height !== height_) this.spacer.style.height = height_;
    const top = this.viewport.scrollTop;
    const height = this.viewport.clientHeight || 600;
    const first = Math.max(0, Math.floor(top / ROW_HEIGHT) - OVERSCAN);
    const last = Math.min(n - 1, Math.ceil((top + height) / ROW_HEIGHT) + OVERSCAN);
    const count = Math.max(0, last - first + 1);
    while (this.rowPool.length < count) {
      const row = this._newRow();
      this.rowPool.push(row);
      this.spacer.append(row);
    }
    for (let k = 0; k < this.rowPool.length; k++) {
      const row = this.rowPool[k];
      if (k >= count) {
        row.hidden = true;
        row._key = null;
        continue;
      }
      const index = first + k;
      this._fillRow(row, this.view[index], index, n);
    }
    this._summarize(n);
    if (!this.populated && this.sub && this.sub.seq !== null) {
      this.populated = true;
      performance.mark("t3d:list-populated", { detail: { threads: this.threads.size, rows: count } });
      document.documentElement.dataset.listPopulated = String(this.threads.size);
    }
  }

  _newRow() {
    const row = h("div", { class: "row", role: "listitem" });
    const link = h("a", { class: "row-link" });
    link.addEventListener("click", (e) => {
      if (e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey) return;
      e.preventDefault();
      this.onOpen(link.dataset.id, { focus: false });
    });
    row._dot = h("span", { class: "dot", "aria-hidden": "true" });
    row._title = h("span", { class: "row-title" });
    row._prompts = h("span", { class: "row-prompts" });
    row._time = h("time", { class: "row-time" });
    row._meta = h("span", { class: "row-meta" });
    link.append(row._dot, row._title, row._prompts, row._time, row._meta);
    row._link = link;
    row.append(link);
    return row;
  }

  _fillRow(row, t, index, n) {
    row.hidden = false;
    row.style.transform = `translateY(${index * ROW_HEIGHT}px)`;
    const prompts = this.prompts.get(t.id) || (t.status === "waiting" ? 1 : 0);
    const selected = t.id === this.selected;
    const key = `${t.id}:${t._v}:${prompts}:${selected}:${index}:${n}`;
    if (row._key === key) return;
    row._key = key;
    row.setAttribute("aria-posinset", String(index + 1));
    row.setAttribute("aria-setsize", String(n));
    const link = row._link;
    link.dataset.id = t.id;
    link.href = `#/t/${encodeURIComponent(t.id)}`;
    link.id = `row-${t.id}`;
    if (selected) link.setAttribute("aria-current", "true");
    else link.removeAttribute("aria-current");
    const status = t.archived_at ? "archived" : t.status;
    row.className = `row st-${status}${prompts ? " has-prompts" : ""}`;
    row._dot.className = `dot st-${status}`;
    row._title.textContent = threadTitle(t);
    row._prompts.textContent = prompts ? `${prompts} prompt${prompts === 1 ? "" : "s"} waiting` : "";
    const when = t.last_activity_at ?? t.created_at;
    row._time.textContent = ago(when);
    row._time.dateTime = typeof when === "number" ? new Date(when * 1000).toISOString() : "";
    row._time.title = absoluteTime(when);
    const project = this.projects.get(t.project_id);
    const kind = t.parent_thread_id ? "subagent · " : "";
    row._meta.textContent = `${kind}${projectName(project)} · ${t.provider} · ${t.archived_at ? "archived" : statusText(t.status, t.queue_reason)}`;
  }

  _summarize(shown) {
    const total = this.threads.size;
    const prompts = this.promptTotal();
    const key = `${shown}:${total}:${prompts}:${this.populated}`;
    if (this._summaryKey === key) return;
    this._summaryKey = key;
    const count = this.summary.firstChild;
    const noun = total === 1 ? "thread" : "threads";
    count.textContent = shown === total ? `${total.toLocaleString()} ${noun}` : `${shown.toLocaleString()} of ${total.toLocaleString()} ${noun}`;
    this.promptsButton.hidden = prompts === 0;
    this.promptsButton.textContent = `${prompts} prompt${prompts === 1 ? "" : "s"} waiting`;
    this.empty.hidden = shown !== 0 || !this.populated;
    this.empty.textContent = total === 0
      ? "No threads yet. Start one with t3d ctl run, or any client of the API."
      : "No thread matches these filters.";
    this.onCounts(prompts);
  }

  /** Mark the open thread and bring its row into view. */
  setSelected(id) {
    this.selected = id;
    this.scrollTo(id);
    for (const row of this.rowPool) row._key = null;
    this._schedule();
  }

  scrollTo(id) {
    if (this.viewDirty) this._rebuildView();
    const index = this.view.findIndex((t) => t.id === id);
    if (index < 0) return;
    const top = index * ROW_HEIGHT;
    const vp = this.viewport;
    if (top < vp.scrollTop) vp.scrollTop = top;
    else if (top + ROW_HEIGHT > vp.scrollTop + vp.clientHeight) vp.scrollTop = top + ROW_HEIGHT - vp.clientHeight;
  }

  /** The id of the thread ``delta`` rows from the open one in the list as shown. */
  neighbour(delta) {
    if (this.viewDirty) this._rebuildView();
    if (!this.view.length) return null;
    const index = this.view.findIndex((t) => t.id === this.selected);
    const next = index < 0 ? (delta > 0 ? 0 : this.view.length - 1) : Math.min(this.view.length - 1, Math.max(0, index + delta));
    return this.view[next].id;
  }

  focusRow(index) {
    if (!this.view.length) return;
    index = Math.min(this.view.length - 1, Math.max(0, index));
    const id = this.view[index].id;
    const vp = this.viewport;
    const top = index * ROW_HEIGHT;
    if (top < vp.scrollTop) vp.scrollTop = top;
    else if (top + ROW_HEIGHT > vp.scrollTop + vp.clientHeight) vp.scrollTop = top + ROW_HEIGHT - vp.clientHeight;
    this.render();
    const link = document.getElementById(`row-${id}`);
    if (link) link.focus();
  }

  focusList() {
    const index = Math.max(0, this.view.findIndex((t) => t.id === this.selected));
    this.focusRow(index);
  }

  _onKey(e) {
    const link = e.target.closest && e.target.closest(".row-link");
    if (!link) return;
    const index = this.view.findIndex((t) => t.id === link.dataset.id);
    const page = Math.max(1, Math.floor(this.viewport.clientHeight / ROW_HEIGHT) - 1);
    const moves = { ArrowDown: 1, ArrowUp: -1, PageDown: page, PageUp: -page };
    if (e.key in moves) {
      e.preventDefault();
      this.focusRow(index + moves[e.key]);
    } else if (e.key === "Home") {
      e.preventDefault();
      this.focusRow(0);
    } else if (e.key === "End") {
      e.preventDefault();
      this.focusRow(this.view.length - 1);
    } else if (e.key === "Enter") {
      e.preventDefault();
      this.onOpen(link.dataset.id, { focus: true });
    }
  }

  projectOf(thread) {
    return thread ? this.projects.get(thread.project_id) : undefined;
  }
}
