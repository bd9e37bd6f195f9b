// Runs before the first paint (a classic script in <head>): the saved theme, else the system's.
(function () {
  let theme = null;
  try {
    theme = localStorage.getItem("mlxd.theme");
  } catch (e) {
    theme = null; // storage blocked: follow the system
  }
  if (theme === "light" || theme === "dark") document.documentElement.dataset.theme = theme;
})();
