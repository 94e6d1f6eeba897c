// Loaded between require.js and the ipywidgets HTML manager (see nb_ipywidgets_js in _config.yml).
// The manager registers its AMD modules by name ("@jupyter-widgets/html-manager/dist/libembed-amd", ...) and
// loads its fonts relative to where RequireJS says those modules live: by default the page's own folder,
// where they do not exist. Point the names at the copy the book serves in _static/vendor/html-manager/.
(function () {
  if (!window.require || !window.require.config) return;
  var script = document.currentScript;
  var staticRoot = script.src.slice(0, script.src.lastIndexOf("/") + 1);  // .../_static/
  var manager = staticRoot + "vendor/html-manager";
  window.require.config({
    paths: {
      "@jupyter-widgets/html-manager/dist": manager,
      "@jupyter-widgets/html-manager": manager + "/html-manager",
      "@jupyter-widgets/base": manager + "/base",
      "@jupyter-widgets/controls": manager + "/controls",
    },
  });
})();

// The manager typesets math in widget labels with the MathJax 2 call MathJax.Hub.Queue(["Typeset", Hub, el]);
// the book loads MathJax 3, which has no Hub (the call throws). Give MathJax 3 that one entry point.
document.addEventListener("DOMContentLoaded", function () {
  var mj = window.MathJax;
  if (!mj || mj.Hub || !mj.startup) return;  // no MathJax, or MathJax 2
  mj.Hub = {
    Queue: function (job) {
      var element = Array.isArray(job) ? job[2] : undefined;
      mj.startup.promise.then(function () {
        return mj.typesetPromise(element ? [element] : undefined);
      });
    },
  };
});
