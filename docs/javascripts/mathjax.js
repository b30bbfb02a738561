// MathJax reads the spans pymdownx.arithmatex (generic mode) writes; re-typeset on each instant-navigation page.
window.MathJax = {
  tex: { inline: [["\\(", "\\)"]], display: [["\\[", "\\]"]], processEscapes: true, processEnvironments: true },
  options: { ignoreHtmlClass: ".*|", processHtmlClass: "arithmatex" },
};
if (typeof document$ !== "undefined") {
  document$.subscribe(() => { if (window.MathJax.typesetPromise) { window.MathJax.typesetPromise(); } });
}
