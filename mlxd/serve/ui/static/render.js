// Model text to safe DOM: markdown (marked) -> sanitized (DOMPurify) -> highlighted (highlight.js).
// Model output is untrusted: nothing it writes may run script or reach another origin.

const PURIFY = {
  FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select", "iframe", "svg", "math"],
  FORBID_ATTR: ["style", "srcset", "action", "formaction"],
  ALLOW_DATA_ATTR: false,
};
const SAFE_URL = /^(https?:|mailto:|#|\/(?!\/))/i;

let hooked = false;
function hook() {
  if (hooked) return;
  hooked = true;
  window.DOMPurify.addHook("afterSanitizeAttributes", (node) => {
    // links: only http(s)/mailto/local, opened away from the page; images: this server only
    if (node.tagName === "A") {
      const href = node.getAttribute("href") || "";
      if (!SAFE_URL.test(href.trim())) node.removeAttribute("href");
      node.setAttribute("target", "_blank");
      node.setAttribute("rel", "noopener noreferrer nofollow");
    }
    if (node.tagName === "IMG") {
      const src = (node.getAttribute("src") || "").trim();
      if (!/^(data:image\/|\/(?!\/))/i.test(src)) node.removeAttribute("src");
    }
  });
}

// `<think>…</think>` inside content: the reasoning part and the answer part. An unclosed tag is
// reasoning still streaming; a lone `</think>` ends reasoning whose opening tag was the prompt's.
export function splitThink(text) {
  const open = text.indexOf("<think>");
  const close = text.indexOf("</think>");
  if (open >= 0 && (close < 0 || open < close)) {
    const before = text.slice(0, open);
    const rest = text.slice(open + 7);
    const end = rest.indexOf("</think>");
    if (end < 0) return { reasoning: rest, content: before };
    return { reasoning: rest.slice(0, end), content: before + rest.slice(end + 8) };
  }
  if (close >= 0) return { reasoning: text.slice(0, close), content: text.slice(close + 8) };
  return { reasoning: "", content: text };
}

export function markdownHTML(text) {
  hook();
  const html = window.marked.parse(text, { gfm: true, breaks: false, async: false });
  return window.DOMPurify.sanitize(html, PURIFY);
}

// Renders into `el`; `final` adds highlighting and copy buttons (skipped while streaming).
export function renderMarkdown(el, text, final) {
  el.innerHTML = markdownHTML(text);
  if (!final) return;
  for (const code of el.querySelectorAll("pre > code")) {
    try {
      window.hljs.highlightElement(code);
    } catch (e) {
      // an unknown language stays plain
    }
    const pre = code.parentElement;
    const copy = document.createElement("button");
    copy.type = "button";
    copy.className = "copy";
    copy.textContent = "Copy";
    copy.addEventListener("click", () => copyText(code.textContent, copy));
    pre.appendChild(copy);
  }
}

async function copyText(text, button) {
  try {
    await navigator.clipboard.writeText(text);
    button.textContent = "Copied";
  } catch (e) {
    button.textContent = "Copy failed";
  }
  setTimeout(() => {
    button.textContent = "Copy";
  }, 1500);
}

export function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}
