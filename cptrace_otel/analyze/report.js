// cptrace-otel report: inlined into the HTML file (no network). Hover text for records, bars and findings; a click
// on a finding (its table row or its red mark) selects its evidence records; #trace=<32 hex> (the link from Jaeger)
// scrolls to that node's panel, or says how to draw it when the run report has none.
(function () {
  'use strict';
  var data = JSON.parse(document.getElementById('cptrace-data').textContent);
  var recs = data.records, findings = data.findings, traces = data.traces || {};
  var tip = document.getElementById('tip');

  var evidenceOf = {};   // record index -> the findings it is evidence of
  findings.forEach(function (f, k) { (f.records || []).forEach(function (i) { (evidenceOf[i] = evidenceOf[i] || []).push(k); }); });
  function recText(i) {
    var r = recs[i];
    var where = r[6] ? '  ' + r[6].split('/').pop() : '';
    var ev = (evidenceOf[i] || []).map(function (k) { return '  << evidence of ' + findings[k].code + ' #' + (k + 1); });
    return '[' + r[0] + '] rank ' + r[1] + '  seq ' + r[2] + '  epoch ' + r[4] + '  ts ' + r[3] + where + ev.join('') +
      '\n' + r[5];
  }
  // Records a few ns apart share a pixel: the hover text lists every record of the lane under the pointer.
  function recsAt(el) {
    var x = +el.getAttribute('x'), lane = el.closest('.lane'), near = [];
    (lane ? lane.querySelectorAll('.rec') : [el]).forEach(function (m) {
      if (Math.abs(+m.getAttribute('x') - x) <= 2) near.push(+m.dataset.i);
    });
    near.sort(function (a, b) { return recs[a][2] - recs[b][2]; });
    var more = near.length > 10 ? '\n... and ' + (near.length - 10) + ' more records here' : '';
    return near.slice(0, 10).map(recText).join('\n') + more;
  }
  function findingText(i) {
    var f = findings[i];
    return f.severity + ' ' + f.code + ' (' + f.rule + ')  rank ' + f.rank + '  epoch ' + f.epoch +
      (f.node === null ? '' : '  node ' + f.node) + (f.op === null ? '' : '  op ' + f.op) + '\n' + f.message +
      '\nevidence seq ' + f.evidence.join(', ') + '  (click to select)';
  }
  function place(e) {
    var x = e.clientX + 14, y = e.clientY + 14;
    var w = tip.offsetWidth, h = tip.offsetHeight;
    if (x + w > window.innerWidth - 4) x = Math.max(4, e.clientX - w - 10);
    if (y + h > window.innerHeight - 4) y = Math.max(4, e.clientY - h - 10);
    tip.style.left = x + 'px';
    tip.style.top = y + 'px';
  }
  document.addEventListener('mouseover', function (e) {
    var t = e.target.closest ? e.target.closest('[data-i],[data-f],[data-tip]') : null;
    if (!t || t.tagName === 'TR') { tip.hidden = true; return; }
    var d = t.dataset;
    tip.textContent = d.i !== undefined ? recsAt(t) : d.f !== undefined ? findingText(+d.f) : d.tip;
    tip.hidden = false;
    place(e);
  });
  document.addEventListener('mousemove', function (e) { if (!tip.hidden) place(e); });

  function select(i) {
    document.querySelectorAll('.sel').forEach(function (el) { el.classList.remove('sel'); });
    var marks = document.querySelectorAll('[data-ev~="' + i + '"], .fmark[data-f="' + i + '"], tr[data-f="' + i + '"]');
    marks.forEach(function (el) { el.classList.add('sel'); });
    var first = document.querySelector('.fmark[data-f="' + i + '"]') || document.querySelector('[data-ev~="' + i + '"]');
    if (first && first.scrollIntoView) first.scrollIntoView({block: 'center', inline: 'center'});
  }
  document.addEventListener('click', function (e) {
    var t = e.target.closest ? e.target.closest('[data-f]') : null;
    if (t && !e.target.closest('a')) select(+t.dataset.f);
  });

  function fromHash() {
    var m = /^#trace=([0-9a-f]{32})$/.exec(location.hash);
    if (!m) return;
    var banner = document.getElementById('banner');
    var el = document.getElementById('trace-' + m[1]);
    if (el) {
      el.classList.add('flash');
      el.scrollIntoView();
      banner.hidden = true;
      return;
    }
    var hit = traces[m[1]];
    banner.textContent = hit
      ? 'Trace ' + m[1] + ' is node ' + hit[1] + ' of epoch ' + hit[0] + ', not drawn in this report: make its own with ' +
        'cptrace-otel report --node ' + hit[1] + ' --epoch ' + hit[0] + ' ' + data.sources
      : 'Trace ' + m[1] + ' is not a node of this run (' + (data.run_id || 'no run id') + ').';
    banner.hidden = false;
  }
  window.addEventListener('hashchange', fromHash);
  fromHash();
})();
