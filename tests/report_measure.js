// Injected into a copy of the sweep report by tests/test_sweep_html_render.py: once plotly has
// drawn, read back what the browser shows (line and marker colours per panel, tick texts,
// legend entries, titles, the table's and the page's widths) as JSON in a pre element (id
// "measured"), which --dump-dom then carries out. Names come from plotly's data by trace uid;
// everything else from the rendered SVG and layout.
(function () {
  function text(el) {
    if (!el) { return null; }
    return (el.getAttribute('data-unformatted') || el.textContent || '').trim();
  }
  function all(root, selector) { return Array.from(root.querySelectorAll(selector)); }
  function measure() {
    var gd = document.getElementById('charts');
    if (!gd || !gd._fullData || !document.querySelector('#charts .main-svg')) {
      return setTimeout(measure, 50);
    }
    var names = {};
    gd._fullData.forEach(function (t) { names[t.uid] = {name: t.name, type: t.type}; });
    var subplots = {};
    all(document, '#charts g.subplot').forEach(function (sp) {
      var traces = all(sp, 'g.trace').map(function (g) {
        var uid = (g.getAttribute('class').match(/trace([0-9a-f]{6})/) || [])[1];
        var line = g.querySelector('path.js-line');
        var point = g.querySelector('path.point');
        var known = names[uid] || {};
        return {name: known.name || null, type: known.type || null,
                stroke: line ? line.style.stroke : null,
                marker: point ? point.style.fill : null,
                points: all(g, 'path.point').length,
                outlines: all(g, 'g.point path').map(function (p) { return p.style.stroke; })};
      });
      subplots[sp.getAttribute('class').split(' ')[1]] = {
        traces: traces,
        xticks: all(sp, '.xaxislayer-above text').map(text),
        yticks: all(sp, '.yaxislayer-above text').map(text)};
    });
    var legends = {};
    ['legend', 'legend2'].forEach(function (cls) {
      legends[cls] = all(document, '#charts g.' + cls + ' g.traces').map(function (g) {
        var symbol = g.querySelector('.legendlines path') || g.querySelector('.legendpoints path');
        return {text: text(g.querySelector('text.' + cls + 'text')),
                colour: symbol ? (symbol.style.stroke || symbol.style.fill) : null};
      });
    });
    var table = document.getElementById('layouts'), box = table.parentElement;
    var out = {
      subplots: subplots, legends: legends,
      annotations: all(document, '#charts g.annotation text').map(text),
      axis_titles: all(document, '#charts g[class^="g-y"] text').map(text),
      page: {scroll_width: document.documentElement.scrollWidth, inner_width: window.innerWidth},
      table: {width: table.scrollWidth, box_width: box.clientWidth,
              box_scroll_width: box.scrollWidth, overflow_x: getComputedStyle(box).overflowX}};
    var pre = document.createElement('pre');
    pre.id = 'measured';
    pre.textContent = JSON.stringify(out);
    document.body.appendChild(pre);
  }
  window.addEventListener('load', function () { setTimeout(measure, 0); });
})();
