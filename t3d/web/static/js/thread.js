// The thread view, live from subscribe.thread: turns and their items as they stream,
// prompts answered inline, a turn's diff, and the controls (next turn, interrupt, force
// stop, revert). Entities arrive whole, so applying an event is "replace it"; the DOM is
// updated in place, once per animation frame, for what changed only.

import { diffPanel } from "./diff.js";
import { RpcError } from "./rpc.js";
import {
  absoluteTime,
  bytes,
  duration,
  h,
  newId,
  pretty,
  shorten,
  statusText,
  threadTitle,
  toolArgument,
} from "./util.js";

// Turns held in the view; older ones are dropped (and can be loaded again).
const MAX_TURNS = 60;
const ACTIVE = new Set(["starting", "running", "waiting"]);
const TERMINAL = new Set(["completed", "interrupted", "failed", "cancelled"]);
const PAGE_TURNS = 10;
// Time a frame may spend drawing the turns of a thread just opened.
const SLICE_MS = 12;

export class ThreadView {
  constructor({ root, rpc, list, ui }) {
    this.root = root;
    this.rpc = rpc;
    this.list = list;
    this.ui = ui; // {announce(text), toast(text, kind), confirm(text, label) -> Promise<bool>}
    this.state = null;
    this._placeholder();
  }

  _placeholder() {
    if (this.resizer) this.resizer.disconnect();
    this.resizer = null;
    this.root.replaceChildren(
      h("div", { class: "placeholder" }, h("h2", null, "No thread open"), h("p", null, "Pick a thread from the list (or press j and k to move through them)."))
    );
  }

  get threadId() {
    return this.state ? this.state.id : null;
  }

  close() {
    if (this.state && this.state.sub) this.state.sub.close();
    this.state = null;
    this._placeholder();
  }

  open(threadId) {
    if (this.state && this.state.id === threadId) return;
    if (this.state && this.state.sub) this.state.sub.close();
    const s = {
      id: threadId,
      thread: this.list.threads.get(threadId) || null,
      turns: new Map(),
      items: new Map(),
      requests: new Map(),
      hasMore: false,
      before: null,
      loaded: false,
      gone: false,
      sections: new Map(), // turn id -> section element
      itemEls: new Map(), // item id -> element
      dirtyTurns: new Set(),
      dirtyItems: new Set(),
      full: true,
      scheduled: false,
    };
    this.state = s;
    this._buildFrame(s);
    s.sub = this.rpc.subscribe("subscribe.thread", { thread_id: threadId }, {
      onSnapshot: (snap) => this._onSnapshot(s, snap),
      onEvent: (event) => this._onEvent(s, event),
      onError: (error) => {
        s.gone = error.code === -32001;
        this.status.textContent = s.gone ? "This thread does not exist (any more)." : `Could not follow this thread: ${error.message}`;
        this.status.hidden = false;
      },
    });
  }

  // --- the frame: header, turns, composer --------------------------------------------------

  _buildFrame(s) {
    this.title = h("h2", { id: "thread-title", tabindex: "-1" }, s.thread ? threadTitle(s.thread) : "Loading…");
    this.meta = h("p", { class: "thread-meta" });
    // A subagent's thread names the thread whose agent started it (issue 22's tree).
    this.parentLink = h("a", { class: "parent-link" });
    this.parentLine = h("p", { class: "thread-parent", hidden: true }, "Subagent of ", this.parentLink);
    this.interruptButton = h("button", { type: "button", onclick: () => this.interrupt(), title: "Stop the running turn (it ends interrupted); queued turns are cancelled" }, "Interrupt");
    this.forceButton = h("button", { type: "button", class: "danger", onclick: () => this.forceStop(), title: "Kill the thread's agent process (its running turn ends cancelled)" }, "Force stop");
    this.backButton = h("a", { class: "back button-like", href: "#/" }, "← Threads");
    const head = h(
      "header",
      { class: "thread-head" },
      this.backButton,
      h("div", { class: "thread-heading" }, this.title, this.meta, this.parentLine),
      h("div", { class: "thread-actions", role: "group", "aria-label": "Thread controls" }, this.interruptButton, this.forceButton),
    );
    this.olderButton = h("button", { type: "button", class: "small older", hidden: true, onclick: () => this.loadOlder() }, "Load older turns");
    this.status = h("p", { class: "thread-status", hidden: true });
    // Pinned to the end while the reader is there: a scroll event (layout is fresh then)
    // says whether they are; when the content grows, a ResizeObserver (run after the
    // browser's own layout, before paint) scrolls to the new end. No layout is forced.
    this.content = h("div", { class: "turns-content" }, this.olderButton, this.status);
    this.turnsEl = h("div", { class: "turns", id: "turns", tabindex: "-1", "aria-label": "Turns" }, this.content);
    this.pinned = true;
    this.turnsEl.addEventListener("scroll", () => {
      const el = this.turnsEl;
      this.pinned = el.scrollTop + el.clientHeight >= el.scrollHeight - 48;
    }, { passive: true });
    if (this.resizer) this.resizer.disconnect();
    this.resizer = new ResizeObserver(() => {
      if (this.pinned) this.turnsEl.scrollTop = this.turnsEl.scrollHeight;
    });
    this.resizer.observe(this.content);
    this.textarea = h("textarea", { id: "composer-text", rows: "2", placeholder: "Message for the next turn (Ctrl+Enter sends)", "aria-describedby": "composer-hint" });
    this.sendButton = h("button", { type: "submit", class: "primary" }, "Send");
    this.hint = h("p", { id: "composer-hint", class: "composer-hint" });
    const composer = h(
      "form",
      { class: "composer", "aria-label": "Start the next turn", onsubmit: (e) => { e.preventDefault(); this.send(); } },
      h("label", { for: "composer-text", class: "visually-hidden" }, "Message for the next turn"),
      this.textarea,
      this.sendButton,
      this.hint,
    );
    this.textarea.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
        e.preventDefault();
        this.send();
      }
    });
    this.root.replaceChildren(head, this.turnsEl, composer);
    this._renderHeader(s);
  }

  focusTitle() {
    if (this.title) this.title.focus();
  }

  focusComposer() {
    if (this.textarea) this.textarea.focus();
  }

  // --- the model ------------------------------------------------------------------------

  _onSnapshot(s, snap) {
    if (this.state !== s) return;
    s.thread = snap.thread || s.thread;
    if (s.loaded) {
      this._merge(s, snap);
      return;
    }
    s.turns.clear();
    s.items.clear();
    s.requests.clear();
    for (const t of snap.turns || []) s.turns.set(t.id, t);
    for (const i of snap.items || []) s.items.set(i.id, i);
    for (const r of snap.requests || []) s.requests.set(r.id, r);
    s.hasMore = !!snap.has_more;
    s.before = snap.before ?? null;
    s.loaded = true;
    s.full = true;
    this._schedule(s, true);
  }

  /** A later snapshot (a resync, or a reconnect after too long a gap) is merged into what
   * is shown, not drawn afresh: the reader keeps their place and what they opened. */
  _merge(s, snap) {
    const turns = snap.turns || [];
    const oldest = turns.reduce((m, t) => Math.min(m, t.ordinal), Infinity);
    const kept = new Set(turns.map((t) => t.id));
    for (const [id, turn] of s.turns) {
      if (turn.ordinal >= oldest && !kept.has(id)) {
        s.turns.delete(id);
        const section = s.sections.get(id);
        if (section) section.remove();
        s.sections.delete(id);
      }
    }
    for (const t of turns) {
      s.turns.set(t.id, t);
      s.dirtyTurns.add(t.id);
    }
    for (const i of snap.items || []) {
      s.items.set(i.id, i);
      s.dirtyItems.add(i.id);
    }
    for (const r of s.requests.values()) if (r.item_id) s.dirtyItems.add(r.item_id);
    s.requests.clear();
    for (const r of snap.requests || []) {
      s.requests.set(r.id, r);
      if (r.item_id) s.dirtyItems.add(r.item_id);
    }
    // Ordinals are dense from 1: older turns exist while the oldest held is past the first.
    const held = [...s.turns.values()].reduce((m, t) => Math.min(m, t.ordinal), Infinity);
    s.hasMore = isFinite(held) && held > 1;
    s.before = s.hasMore ? held : null;
    this._schedule(s);
  }

  _onEvent(s, event) {
    if (this.state !== s) return;
    const e = event.entity;
    switch (event.kind) {
      case "thread.updated":
        s.thread = e;
        break;
      case "thread.deleted":
        s.gone = true;
        s.thread = null;
        this.status.textContent = "This thread was deleted.";
        this.status.hidden = false;
        break;
      case "turn.updated": {
        const before = s.turns.get(e.id);
        s.turns.set(e.id, e);
        s.dirtyTurns.add(e.id);
        if (TERMINAL.has(e.status) && before && !TERMINAL.has(before.status)) {
          this.ui.announce(`Turn ${e.ordinal} ${e.status}${e.error ? `: ${e.error}` : ""}`);
        }
        this._prune(s);
        break;
      }
      case "item.updated": {
        const before = s.items.get(e.id);
        s.items.set(e.id, e);
        s.dirtyItems.add(e.id);
        if (e.kind === "approval_request" && e.status === "pending" && (!before || before.status !== "pending")) {
          this.ui.announce(`Prompt: allow ${e.title || "a tool"} ${e.text || ""}? Press a to allow, s to allow for the session, d to deny.`);
        }
        break;
      }
      case "request.updated":
        s.requests.set(e.id, e);
        if (e.item_id) s.dirtyItems.add(e.item_id);
        break;
      default:
        break; // session.updated, checkpoint.updated: the items say what matters
    }
    this._schedule(s, false);
  }

  _prune(s) {
    if (s.turns.size <= MAX_TURNS) return;
    const ordered = [...s.turns.values()].sort((a, b) => a.ordinal - b.ordinal);
    const drop = ordered.slice(0, ordered.length - MAX_TURNS).filter((t) => !ACTIVE.has(t.status) && t.status !== "queued");
    for (const turn of drop) {
      s.turns.delete(turn.id);
      const section = s.sections.get(turn.id);
      if (section) section.remove();
      s.sections.delete(turn.id);
      for (const [id, item] of s.items) {
        if (item.turn_id === turn.id) {
          s.items.delete(id);
          s.itemEls.delete(id);
        }
      }
    }
    if (drop.length) {
      s.hasMore = true;
      const oldest = [...s.turns.values()].reduce((m, t) => Math.min(m, t.ordinal), Infinity);
      s.before = isFinite(oldest) ? oldest : s.before;
    }
  }

  async loadOlder() {
    const s = this.state;
    if (!s || !s.hasMore || s.before === null) return;
    this.olderButton.disabled = true;
    try {
      const page = await this.rpc.snapshot({ thread_id: s.id, turn_limit: PAGE_TURNS, before: s.before });
      if (this.state !== s) return;
      for (const t of page.turns || []) {
        if (s.turns.has(t.id)) continue;
        s.turns.set(t.id, t);
        s.dirtyTurns.add(t.id);
      }
      for (const i of page.items || []) {
        if (s.items.has(i.id)) continue;
        s.items.set(i.id, i);
        s.dirtyItems.add(i.id);
      }
      s.hasMore = !!page.has_more;
      s.before = page.before ?? null;
      const anchor = this.turnsEl.scrollHeight - this.turnsEl.scrollTop;
      this._flush(s);
      this.turnsEl.scrollTop = this.turnsEl.scrollHeight - anchor;
    } catch (error) {
      this.ui.toast(`Could not load older turns: ${error.message}`, "error");
    } finally {
      this.olderButton.disabled = false;
    }
  }

  // --- drawing --------------------------------------------------------------------------

  _schedule(s) {
    if (s.scheduled) return;
    s.scheduled = true;
    requestAnimationFrame(() => {
      s.scheduled = false;
      if (this.state === s) this._flush(s);
    });
  }

  _flush(s) {
    if (s.full) {
      s.full = false;
      for (const section of s.sections.values()) section.remove();
      s.sections.clear();
      s.itemEls.clear();
      // Drawn newest turn first, a frame's slice at a time, so that a long thread opens
      // without one long task; live changes meanwhile are drawn as they come.
      s.backlog = [...s.turns.values()].sort((a, b) => b.ordinal - a.ordinal).map((t) => t.id);
      s.dirtyTurns.clear();
      s.dirtyItems.clear();
      this.status.hidden = !(s.loaded && s.turns.size === 0 && !s.gone);
      if (!this.status.hidden) this.status.textContent = "No turns yet: send the first message below.";
    } else {
      for (const id of s.dirtyTurns) {
        const turn = s.turns.get(id);
        if (turn) this._renderTurn(s, turn);
      }
      for (const id of s.dirtyItems) {
        const item = s.items.get(id);
        if (item && s.turns.has(item.turn_id)) this._renderItem(s, item);
      }
      if (s.dirtyTurns.size) this.status.hidden = !s.gone;
      s.dirtyTurns.clear();
      s.dirtyItems.clear();
    }
    if (s.backlog && s.backlog.length) this._drawBacklog(s);
    this.olderButton.hidden = !s.hasMore;
    this._renderHeader(s);
  }

  _drawBacklog(s) {
    const deadline = performance.now() + SLICE_MS;
    const byTurn = new Map();
    for (const item of s.items.values()) {
      if (!byTurn.has(item.turn_id)) byTurn.set(item.turn_id, []);
      byTurn.get(item.turn_id).push(item);
    }
    while (s.backlog.length && performance.now() < deadline) {
      const turn = s.turns.get(s.backlog.shift());
      if (!turn) continue;
      this._renderTurn(s, turn);
      for (const item of (byTurn.get(turn.id) || []).sort((a, b) => itemOrder(a) - itemOrder(b))) this._renderItem(s, item);
    }
    if (s.backlog.length) this._schedule(s);
  }

  _renderHeader(s) {
    const t = s.thread;
    if (!this.title) return;
    put(this.title, t ? threadTitle(t) : s.gone ? "Thread gone" : "Loading…");
    const project = t ? this.list.projectOf(t) : null;
    const running = [...s.turns.values()].some((turn) => ACTIVE.has(turn.status));
    const queued = [...s.turns.values()].filter((turn) => turn.status === "queued").length;
    const parts = [];
    if (project) parts.push(project.path);
    if (t) parts.push(t.provider + (t.model ? ` (${t.model})` : ""));
    if (t) parts.push(statusText(t.status, t.queue_reason));
    if (queued) parts.push(`${queued} queued turn${queued === 1 ? "" : "s"}`);
    put(this.meta, parts.join(" · "));
    this.meta.dataset.status = t ? t.status : "";
    const parentId = t && t.parent_thread_id;
    this.parentLine.hidden = !parentId;
    if (parentId) {
      const parent = this.list.threads.get(parentId);
      const href = `#/t/${encodeURIComponent(parentId)}`;
      if (this.parentLink.getAttribute("href") !== href) this.parentLink.setAttribute("href", href);
      put(this.parentLink, parent ? threadTitle(parent) : `thread ${parentId.slice(0, 8)}`);
    }
    // A subagent runs inside its parent's agent: only the parent's turn can be stopped.
    const subagent = !!(t && t.subagent);
    this.interruptButton.disabled = subagent || !(running || queued);
    this.forceButton.disabled = subagent || !t || s.gone;
    this.sendButton.disabled = subagent || !t || s.gone || !!t.archived_at;
    put(this.hint, subagent
      ? "A subagent's thread takes no turns of its own: its parent's agent runs it. Interrupt or message the parent thread."
      : t && t.archived_at
      ? "This thread is archived; it takes no new turns."
      : running
        ? "A turn is running: a new message waits as a queued turn until it ends."
        : "");
    this.hint.hidden = !this.hint.textContent;
  }

  _section(s, turn) {
    let section = s.sections.get(turn.id);
    if (section) return section;
    const heading = h("h3", { class: "turn-title", id: `turn-h-${turn.id}` });
    const info = h("p", { class: "turn-info" });
    const list = h("ol", { class: "items" });
    section = h("section", { class: "turn", "aria-labelledby": `turn-h-${turn.id}`, "data-turn": turn.id }, h("header", { class: "turn-head" }, heading, info), list);
    section._heading = heading;
    section._info = info;
    section._list = list;
    section._ordinal = turn.ordinal;
    // In ordinal order among the sections already there.
    let next = null;
    for (const other of s.sections.values()) {
      if (other._ordinal > turn.ordinal && (!next || other._ordinal < next._ordinal)) next = other;
    }
    this.content.insertBefore(section, next || null);
    s.sections.set(turn.id, section);
    return section;
  }

  _renderTurn(s, turn) {
    const section = this._section(s, turn);
    section.className = `turn st-${turn.status}${turn.reverted_at ? " reverted" : ""}`;
    put(section._heading, `Turn ${turn.ordinal}`);
    const bits = [statusText(turn.status, turn.queue_reason)];
    if (turn.started_at && turn.completed_at) bits.push(duration(turn.completed_at - turn.started_at));
    if (typeof turn.cost_usd === "number") bits.push(`$${turn.cost_usd.toFixed(4)}`);
    if (turn.interrupt_requested_at && !TERMINAL.has(turn.status)) bits.push("interrupt asked");
    put(section._info, bits.join(" · "));
    section._info.title = absoluteTime(turn.completed_at || turn.started_at || turn.requested_at);
    let note = section.querySelector(":scope > .turn-note");
    const text = [
      turn.error ? turn.error : "",
      turn.reverted_at ? "The files were reverted to a checkpoint before this turn; what it changed is gone from them." : "",
    ].filter(Boolean).join(" ");
    if (text) {
      if (!note) {
        note = h("p", { class: "turn-note" });
        section.insertBefore(note, section._list);
      }
      note.textContent = text;
      note.classList.toggle("turn-error", !!turn.error);
    } else if (note) note.remove();
  }

  _renderItem(s, item) {
    const section = this._section(s, s.turns.get(item.turn_id));
    let el = s.itemEls.get(item.id);
    if (!el) {
      el = h("li", { class: "item", "data-item": item.id, "data-kind": item.kind });
      el._order = itemOrder(item);
      let next = null;
      for (const other of section._list.children) {
        if (other._order > el._order && (!next || other._order < next._order)) next = other;
      }
      section._list.insertBefore(el, next);
      s.itemEls.set(item.id, el);
    }
    el.dataset.status = item.status;
    const render = RENDERERS[item.kind] || renderGeneric;
    render.call(this, s, el, item);
  }

  // --- actions ---------------------------------------------------------------------------

  async send() {
    const s = this.state;
    const text = this.textarea.value;
    if (!s || !text.trim()) return;
    this.sendButton.disabled = true;
    try {
      const result = await this.rpc.call("turn.start", { thread_id: s.id, text, command_id: newId() });
      if (this.textarea.value === text) this.textarea.value = "";
      if (result.status === "queued") this.ui.toast("Queued: it starts when the running turn ends.", "info");
    } catch (error) {
      this.ui.toast(`Could not start the turn: ${error.message}`, "error");
    } finally {
      this.sendButton.disabled = false;
    }
  }

  async interrupt() {
    const s = this.state;
    if (!s) return;
    try {
      const r = await this.rpc.call("turn.interrupt", { thread_id: s.id, command_id: newId() });
      this.ui.toast(r.status === "cancelled" ? "No turn was running; the queued turns were cancelled." : "Asked the turn to stop.", "info");
    } catch (error) {
      this.ui.toast(`Could not interrupt: ${error.message}`, "error");
    }
  }

  async forceStop(threadId = this.threadId) {
    if (!threadId) return;
    await forceStop(this.rpc, this.ui, threadId);
  }

  async revert(ordinal) {
    const s = this.state;
    if (!s) return;
    const ok = await this.ui.confirm(
      `Put the thread's files back as they were after turn ${ordinal}? Files the later turns changed are restored; files they created are deleted.`,
      "Revert the files",
    );
    if (!ok) return;
    try {
      const r = await this.rpc.call("checkpoint.revert", { thread_id: s.id, ordinal, command_id: newId() });
      this.ui.toast(`Reverted to after turn ${ordinal}: ${r.restored} file${r.restored === 1 ? "" : "s"} restored, ${r.deleted} deleted.`, "info");
    } catch (error) {
      this.ui.toast(`Could not revert: ${error.message}`, "error");
    }
  }

  /** The first prompt of the open thread still waiting for an answer, if any. */
  pendingPrompt() {
    const s = this.state;
    if (!s) return null;
    for (const r of s.requests.values()) if (r.status === "pending") return r;
    return null;
  }

  async respond(requestId, decision, message) {
    const params = { request_id: requestId, decision, command_id: newId() };
    if (message) params.message = message;
    try {
      await this.rpc.call("request.respond", params);
    } catch (error) {
      this.ui.toast(`Could not answer the prompt: ${error.message}`, "error");
    }
  }

  /** Keyboard: answer the first waiting prompt (a, s) or go to its deny message (d). */
  answerByKey(key) {
    const r = this.pendingPrompt();
    if (!r) return false;
    if (key === "a") this.respond(r.id, "allow");
    else if (key === "s") this.respond(r.id, "allow_session");
    else if (key === "d") {
      const el = this.state.itemEls.get(r.item_id);
      const input = el && el.querySelector("input.deny-message");
      if (input) {
        input.focus();
        el.scrollIntoView({ block: "nearest" });
      } else this.respond(r.id, "deny");
    } else return false;
    return true;
  }

  async detail(target, path, pre, button) {
    button.disabled = true;
    try {
      const r = await this.rpc.call("item.detail", { ...target, path });
      pre.textContent = pretty(r.value);
      button.remove();
    } catch (error) {
      button.disabled = false;
      this.ui.toast(`Could not load it: ${error.message}`, "error");
    }
  }
}

/** Force stop, asked first (shared with the memory banner). */
export async function forceStop(rpc, ui, threadId) {
  const ok = await ui.confirm("Kill this thread's agent process? Its running turn ends cancelled; other agents keep running.", "Force stop");
  if (!ok) return;
  try {
    const r = await rpc.call("thread.force_stop", { thread_id: threadId });
    ui.toast(r.pid ? `Killed the agent (process group ${r.pid}).` : "Stopped the turn before its agent started.", "info");
  } catch (error) {
    ui.toast(`Could not force stop: ${error instanceof RpcError ? error.message : error}`, "error");
  }
}

/** Set an element's text only when it changed (an equal write still costs a layout). */
function put(el, text) {
  if (el.textContent !== text) el.textContent = text;
}

function itemOrder(item) {
  return item.kind === "checkpoint" ? 1e9 : item.ordinal;
}

function requestFor(s, item) {
  for (const r of s.requests.values()) if (r.item_id === item.id) return r;
  return null;
}

// --- renderers: (state, element, item), in place ----------------------------------------

function once(el, build) {
  if (!el._built) {
    el._built = true;
    el.replaceChildren();
    build(el);
  }
}

/** Streamed text grows at its end: append the new part to the one text node when it does,
 * so the browser lays out only what was added; replace it otherwise. */
function setText(el, text) {
  const shown = el._shown ?? "";
  if (text === shown) return;
  if (el._node && text.startsWith(shown)) el._node.appendData(text.slice(shown.length));
  else {
    el._node = document.createTextNode(text);
    el._text.replaceChildren(el._node);
  }
  el._shown = text;
}

function renderMessage(s, el, item) {
  once(el, (el) => {
    const who = { user_message: "You", assistant_message: "Agent" }[item.kind] || "";
    el._text = h("div", { class: "text" });
    el.append(h("div", { class: "who" }, who), el._text);
  });
  const cls = `item msg ${item.kind === "user_message" ? "user" : "assistant"}${item.status === "streaming" ? " streaming" : ""}`;
  if (el.className !== cls) el.className = cls;
  setText(el, item.text || "");
  truncationNote.call(this, el, item, ["text"]);
}

function renderReasoning(s, el, item) {
  once(el, (el) => {
    el._text = h("div", { class: "text" });
    el.append(h("details", { class: "reasoning" }, h("summary", null, "Thinking"), el._text));
  });
  el.className = "item reasoning-item";
  setText(el, item.text || "");
}

function renderTool(s, el, item) {
  once(el, (el) => {
    el._name = h("span", { class: "tool-name" });
    el._arg = h("span", { class: "tool-arg" });
    el._status = h("span", { class: "tool-status" });
    el._body = h("div", { class: "tool-body" });
    const details = h("details", { class: "tool" }, h("summary", null, el._name, " ", el._arg, " ", el._status), el._body);
    details.addEventListener("toggle", () => {
      if (details.open) toolBody.call(this, el, el._item);
    });
    el._details = details;
    el._child = h("a", { class: "subagent-link", hidden: true });
    el.append(details, el._child);
  });
  el._item = item;
  const cls = `item tool-item st-${item.status}`;
  if (el.className !== cls) el.className = cls;
  const data = item.data || {};
  put(el._name, item.title || data.name || (item.kind === "command" ? "Command" : "Tool"));
  put(el._arg, shorten(toolArgument(data) || data.command || item.text || "", 120));
  put(el._status, item.status === "failed" || data.is_error ? "failed" : item.status);
  // A call that started a subagent links to the subagent's own thread (the call's status
  // is the subagent's: it runs until the subagent's result comes).
  const child = data.child_thread_id;
  el._child.hidden = !child;
  if (child) {
    const href = `#/t/${encodeURIComponent(child)}`;
    if (el._child.getAttribute("href") !== href) el._child.setAttribute("href", href);
    put(el._child, "Open the subagent's thread →");
  }
  if (el._details.open) toolBody.call(this, el, item);
}

function toolBody(el, item) {
  const data = item.data || {};
  const body = el._body;
  body.replaceChildren();
  const truncated = new Map((item.truncated || []).map((t) => [t.path.join("."), t]));
  const section = (label, value, path) => {
    if (value === undefined || value === null || value === "") return;
    const pre = h("pre", { class: "tool-value", tabindex: "0" }, pretty(value));
    body.append(h("h4", null, label), pre);
    for (const [key, cut] of truncated) {
      if (key === path.join(".") || key.startsWith(`${path.join(".")}.`)) {
        const button = h("button", { type: "button", class: "small" }, `Show all of ${label.toLowerCase()} (${bytes(cut.bytes)})`);
        button.addEventListener("click", () => this.detail({ item_id: item.id }, cut.path, pre, button));
        body.append(button);
        truncated.delete(key);
      }
    }
  };
  if (item.kind === "command") {
    section("Command", data.command, ["data", "command"]);
    section("Output", data.output ?? data.aggregated_output, ["data", data.output !== undefined ? "output" : "aggregated_output"]);
  } else {
    section("Input", data.input, ["data", "input"]);
    section(data.is_error ? "Error" : "Result", data.result, ["data", "result"]);
    if (data.result_truncated) body.append(h("p", { class: "muted" }, "The agent's output was longer: the daemon keeps its first 16 KiB."));
  }
  if (item.text) section("Text", item.text, ["text"]);
  for (const cut of truncated.values()) {
    const pre = h("pre", { class: "tool-value" });
    const button = h("button", { type: "button", class: "small" }, `Show ${cut.path.join(".")} (${bytes(cut.bytes)})`);
    button.addEventListener("click", () => this.detail({ item_id: item.id }, cut.path, pre, button));
    body.append(button, pre);
  }
  if (!body.childNodes.length) body.append(h("p", { class: "muted" }, item.status === "running" ? "Running…" : "Nothing recorded."));
}

function renderPrompt(s, el, item) {
  const request = requestFor(s, item);
  const pending = item.status === "pending" && (!request || request.status === "pending");
  const key = `${item.status}:${request ? `${request.status}:${request.decision}` : "-"}`;
  if (el._key === key) return;
  el._key = key;
  el._built = false;
  el.className = `item prompt-item${pending ? " pending" : ""}`;
  const data = item.data || {};
  const question = item.kind === "user_input_request"
    ? h("p", { class: "prompt-question", id: `q-${item.id}` }, item.title || "The agent asks", item.text ? `: ${item.text}` : "")
    : h("p", { class: "prompt-question", id: `q-${item.id}` }, "Allow ", h("strong", null, item.title || data.tool_name || "this tool"), item.text ? ` ${item.text}` : "", "?");
  const details = data.input ? h("details", { class: "prompt-input" }, h("summary", null, "What it wants to run"), h("pre", { tabindex: "0" }, pretty(data.input))) : null;
  const box = h("div", { class: "prompt", role: "group", "aria-labelledby": `q-${item.id}` }, question, details);
  if (pending) {
    const message = h("input", { type: "text", class: "deny-message", placeholder: "Why not (optional, sent with Deny)", "aria-label": "Message sent with Deny" });
    const answer = (decision) => {
      if (!request) return;
      for (const b of box.querySelectorAll("button")) b.disabled = true;
      this.respond(request.id, decision, decision === "deny" ? message.value.trim() : "");
    };
    message.addEventListener("keydown", (e) => {
      if (e.key === "Enter") {
        e.preventDefault();
        answer("deny");
      }
    });
    box.append(
      h(
        "div",
        { class: "prompt-actions" },
        h("button", { type: "button", class: "primary", onclick: () => answer("allow"), "aria-keyshortcuts": "a" }, "Allow"),
        h("button", { type: "button", onclick: () => answer("allow_session"), "aria-keyshortcuts": "s" }, "Allow for this session"),
        message,
        h("button", { type: "button", class: "danger", onclick: () => answer("deny"), "aria-keyshortcuts": "d" }, "Deny"),
      ),
      h("p", { class: "prompt-keys muted" }, "Keys: a allow · s allow for the session · d deny with a message"),
    );
    if (!request) box.append(h("p", { class: "muted" }, "Waiting for the prompt's request…"));
  } else {
    const decided = request && request.decision;
    const words = {
      allow: "Allowed",
      allow_session: "Allowed for the session",
      deny: "Denied",
      cancel: "Cancelled",
    };
    let outcome = decided ? words[decided] || decided : { allowed: "Allowed", denied: "Denied" }[item.status] || item.status;
    if (request && request.status === "expired") outcome = "Expired (the turn ended before an answer)";
    if (request && request.message) outcome += `: ${request.message}`;
    box.append(h("p", { class: `prompt-outcome ${item.status}` }, outcome));
  }
  el.replaceChildren(box);
}

function renderCheckpoint(s, el, item) {
  const data = item.data || {};
  once(el, (el) => {
    el._title = h("p", { class: "checkpoint-title" });
    el._files = h("ul", { class: "files" });
    el._diffButton = h("button", { type: "button", class: "small" }, "Show the diff");
    el._revertButton = h("button", { type: "button", class: "small" }, "Revert the files to here");
    el._panel = h("div");
    el._diffButton.addEventListener("click", () => {
      if (el._panel.firstChild) {
        el._panel.replaceChildren();
        el._diffButton.textContent = "Show the diff";
        el._diffButton.setAttribute("aria-expanded", "false");
        return;
      }
      el._panel.append(diffPanel(this.rpc, s.id, el._ordinal));
      el._diffButton.textContent = "Hide the diff";
      el._diffButton.setAttribute("aria-expanded", "true");
    });
    el._revertButton.addEventListener("click", () => this.revert(el._ordinal));
    el.append(h("div", { class: "checkpoint" }, el._title, el._files, h("div", { class: "checkpoint-actions" }, el._diffButton, el._revertButton), el._panel));
  });
  el._ordinal = data.ordinal;
  el.className = `item checkpoint-item st-${data.status}${data.files && data.files.length ? "" : " unchanged"}`;
  el._title.textContent = item.title || "Checkpoint";
  const ok = data.status === "ok";
  el._diffButton.hidden = !ok || !(data.files && data.files.length);
  el._revertButton.hidden = !ok;
  el._files.replaceChildren(
    ...(data.files || []).slice(0, 50).map((f) =>
      h("li", null, h("code", null, f.path), " ", f.additions === null ? "(binary)" : h("span", { class: "stat" }, h("span", { class: "add" }, `+${f.additions}`), " ", h("span", { class: "del" }, `-${f.deletions}`))),
    ),
  );
  if ((data.files || []).length > 50) el._files.append(h("li", { class: "muted" }, `and ${data.files.length - 50} more`));
}

function renderError(s, el, item) {
  el.className = "item error-item";
  el.replaceChildren(h("div", { class: "item-error", role: "note" }, h("strong", null, item.title || "Error"), item.text ? h("p", null, item.text) : null));
}

function renderFileChange(s, el, item) {
  renderTool.call(this, s, el, item);
  el._name.textContent = item.title || "File changes";
}

function renderGeneric(s, el, item) {
  renderTool.call(this, s, el, item);
}

function truncationNote(el, item, path) {
  const cut = (item.truncated || []).find((t) => t.path.join(".") === path.join("."));
  let note = el.querySelector(".truncation");
  if (!cut) {
    if (note) note.remove();
    return;
  }
  if (note) return;
  const button = h("button", { type: "button", class: "small" }, `Show all of it (${bytes(cut.bytes)})`);
  note = h("p", { class: "truncation muted" }, "The text is cut here. ", button);
  button.addEventListener("click", async () => {
    button.disabled = true;
    try {
      const r = await this.rpc.call("item.detail", { item_id: item.id, path: cut.path });
      el._node = null;
      el._shown = null;
      setText(el, String(r.value));
      note.remove();
    } catch (error) {
      button.disabled = false;
      this.ui.toast(`Could not load it: ${error.message}`, "error");
    }
  });
  el.append(note);
}

const RENDERERS = {
  user_message: renderMessage,
  assistant_message: renderMessage,
  reasoning: renderReasoning,
  tool_call: renderTool,
  command: renderTool,
  file_change: renderFileChange,
  approval_request: renderPrompt,
  user_input_request: renderPrompt,
  checkpoint: renderCheckpoint,
  error: renderError,
  subagent: renderGeneric,
};
