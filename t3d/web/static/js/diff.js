// A turn's changes (checkpoint.diff): unified diff text drawn as lines, paged.

import { h } from "./util.js";

/** Append the lines of ``text`` (a unified diff, or a page of one) to ``pre``. */
export function appendDiff(pre, text) {
  const fragment = document.createDocumentFragment();
  for (const line of text.split("\n")) {
    let kind = "ctx";
    if (line.startsWith("diff --git") || line.startsWith("index ") || line.startsWith("--- ") || line.startsWith("+++ ")) kind = "file";
    else if (line.startsWith("@@")) kind = "hunk";
    else if (line.startsWith("+")) kind = "add";
    else if (line.startsWith("-")) kind = "del";
    fragment.append(h("span", { class: `dl dl-${kind}` }, line), "\n");
  }
  pre.append(fragment);
}

/** A panel that loads the diff of turn ``ordinal`` page by page. */
export function diffPanel(rpc, threadId, ordinal, onError) {
  const pre = h("pre", { class: "diff", tabindex: "0", "aria-label": `Changes of turn ${ordinal}` });
  const more = h("button", { type: "button", class: "small", hidden: true }, "Load more of the diff");
  const note = h("p", { class: "diff-note", role: "status" }, "Loading the diff…");
  const panel = h("div", { class: "diff-panel" }, note, pre, more);
  let offset = 0;
  const load = async () => {
    more.disabled = true;
    try {
      const page = await rpc.call("checkpoint.diff", { thread_id: threadId, from_ordinal: ordinal - 1, to_ordinal: ordinal, offset });
      if (offset === 0 && !page.diff) note.textContent = "No changes in this turn.";
      else note.textContent = page.truncated ? "The diff is longer than git's 8 MiB cap; what follows is its start." : "";
      note.hidden = !note.textContent;
      appendDiff(pre, page.diff);
      if (offset === 0) panel.scrollIntoView({ block: "nearest" });
      offset = page.next_offset ?? offset;
      more.hidden = page.next_offset === null || page.next_offset === undefined;
    } catch (error) {
      note.hidden = false;
      note.textContent = `Could not load the diff: ${error.message}`;
      if (onError) onError(error);
    } finally {
      more.disabled = false;
    }
  };
  more.addEventListener("click", load);
  load();
  return panel;
}
