// Apply the saved theme before first paint, so the page never flashes the other palette.
// (A file, not an inline script: the dashboard's Content-Security-Policy allows no inline script.)
(function () {
  var theme = localStorage.getItem("epctl.theme");
  if (theme) document.documentElement.dataset.theme = theme;
})();
