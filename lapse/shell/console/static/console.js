// Live parts of the console's pages: an element with data-live="URL" is fetched again every
// data-every seconds (server-rendered HTML, same origin) and replaced by the element of the same
// id in the answer, so figures, charts and relative times move without reloading the page. When a
// fetch fails the element is marked stale and kept as it was.
"use strict";
(function () {
  function follow(id, url, every) {
    async function refresh() {
      const current = document.getElementById(id);
      if (!current) { return; }
      try {
        const response = await fetch(url, {credentials: "same-origin", headers: {"Accept": "text/html"}});
        const page = new DOMParser().parseFromString(await response.text(), "text/html");
        const fresh = page.getElementById(id);
        if (!response.ok || !fresh) { throw new Error("HTTP " + response.status); }
        current.replaceWith(document.importNode(fresh, true));
        document.body.dataset.updates = String(Number(document.body.dataset.updates || 0) + 1);
      } catch (error) {
        current.classList.add("stale");
      }
      setTimeout(refresh, every * 1000);
    }
    setTimeout(refresh, every * 1000);
  }
  for (const element of document.querySelectorAll("[data-live]")) {
    follow(element.id, element.dataset.live, Number(element.dataset.every || 15));
  }
})();
