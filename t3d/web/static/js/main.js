// The page: one WebSocket (rpc.js), the thread list (shell.js), the open thread
// (thread.js), the memory banner (pressure.js); routing by the address's #fragment
// (#/t/<thread id>), keyboard shortcuts, and the few shared bits of UI (announcements,
// notices, a confirmation dialog).

import { PressureBanner } from "./pressure.js";
import { Rpc } from "./rpc.js";
import { ThreadList } from "./shell.js";
import { ThreadView } from "./thread.js";
import { isTyping } from "./util.js";

// For the tests and the benchmark (bench/web_page.py), and anyone curious in the console:
// the page's parts, and its main-thread long tasks (the last 500).
window.__t3d = { longTasks: [] };
try {
  new PerformanceObserver((list) => {
    const kept = window.__t3d.longTasks;
    for (const entry of list.getEntries()) kept.push({ start: entry.startTime, duration: entry.duration });
    if (kept.length > 500) kept.splice(0, kept.length - 500);
  }).observe({ type: "longtask", buffered: true });
} catch {
  // no long-task timing in this browser
}

const $ = (id) => document.getElementById(id);

const ui = {
  announce(text) {
    const region = $("announce");
    region.textContent = "";
    setTimeout(() => (region.textContent = text), 50);
  },
  toast(text, kind = "info") {
    const box = $("toasts");
    const note = document.createElement("p");
    note.className = `toast ${kind}`;
    note.textContent = text;
    box.append(note);
    while (box.children.length > 3) box.firstChild.remove();
    setTimeout(() => note.remove(), kind === "error" ? 10000 : 4000);
  },
  confirm(text, label) {
    const dialog = $("confirm");
    if (dialog.open) return Promise.resolve(false); // one question at a time
    $("confirm-text").textContent = text;
    $("confirm-yes").textContent = label;
    dialog.returnValue = "";
    dialog.showModal();
    $("confirm-no").focus();
    return new Promise((resolve) => {
      dialog.addEventListener("close", () => resolve(dialog.returnValue === "yes"), { once: true });
    });
  },
};

function setConnection(state) {
  const el = $("conn");
  el.dataset.state = state;
  const words = { connecting: "connecting", live: "live", reconnecting: "reconnecting…", resyncing: "catching up…", "signed-out": "signed out" };
  el.textContent = words[state] || state;
  el.title = state === "live" ? "Connected to the daemon; updates arrive as they happen" : "Not connected to the daemon; it reconnects by itself and catches up";
}

function signedOut() {
  $("app").hidden = true;
  $("signout").hidden = true;
  $("pressure").hidden = true;
  $("signed-out").hidden = false;
  document.title = "t3d: signed out";
}

const rpc = new Rpc({
  url: `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ws`,
  onState: setConnection,
  onSignedOut: signedOut,
});

const list = new ThreadList({
  root: $("threads-pane"),
  rpc,
  onCounts: (n) => {
    const title = n ? `(${n}) t3d: ${n} prompt${n === 1 ? "" : "s"} waiting` : "t3d";
    if (rpc.state !== "signed-out" && document.title !== title) document.title = title;
  },
  onOpen: (id, { focus }) => {
    if (location.hash !== `#/t/${encodeURIComponent(id)}`) location.hash = `#/t/${encodeURIComponent(id)}`;
    else route();
    if (focus) view.focusTitle();
  },
});
const view = new ThreadView({ root: $("thread-view"), rpc, list, ui });
Object.assign(window.__t3d, { rpc, list, view });
const pressure = new PressureBanner({ root: $("pressure"), rpc, list, ui });

function route() {
  const match = location.hash.match(/^#\/t\/(.+)$/);
  if (match) {
    const id = decodeURIComponent(match[1]);
    document.body.dataset.view = "thread";
    view.open(id);
    list.setSelected(id);
  } else {
    document.body.dataset.view = "list";
    view.close();
    list.setSelected(null);
  }
}

window.addEventListener("hashchange", () => {
  route();
  if (document.body.dataset.view === "thread") view.focusTitle();
});

function go(delta) {
  const id = list.neighbour(delta);
  if (id) {
    location.hash = `#/t/${encodeURIComponent(id)}`;
  }
}

document.addEventListener("keydown", (e) => {
  if (e.defaultPrevented || e.altKey || e.ctrlKey || e.metaKey) return;
  if (document.querySelector("dialog[open]")) return;
  if (e.key === "Escape" && isTyping(e.target)) {
    e.target.blur();
    return;
  }
  if (isTyping(e.target)) return;
  switch (e.key) {
    case "j":
      go(1);
      break;
    case "k":
      go(-1);
      break;
    case "/":
      $("thread-search").focus();
      break;
    case "l":
      list.focusList();
      break;
    case "c":
      view.focusComposer();
      break;
    case "a":
    case "s":
    case "d":
      if (!view.answerByKey(e.key)) return;
      break;
    case "?":
      $("help").showModal();
      break;
    default:
      return;
  }
  e.preventDefault();
});

$("help-button").addEventListener("click", () => $("help").showModal());
$("signout").addEventListener("click", async () => {
  try {
    await fetch("/api/auth/logout", { method: "POST", credentials: "same-origin" });
  } finally {
    rpc.stop();
    signedOut();
  }
});

setConnection("connecting");
rpc.start();
list.start();
pressure.start();
route();
