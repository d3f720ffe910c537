// The overview's live list (served from the binary at /console/static/live.js): the server says
// over server-sent events when a run starts or ends, so the page never polls.
const live = new EventSource('/api/live');
// With several nodes each run names the node running it.
live.addEventListener('runs', (e) => {
  const runs = JSON.parse(e.data).runs;
  document.getElementById('active').textContent = runs.length;
  const list = document.getElementById('running');
  list.replaceChildren();
  for (const run of runs) {
    const a = document.createElement('a');
    a.href = '/console/runs/' + encodeURIComponent(run.request_id);
    a.textContent = run.node ? run.request_id + ' (node ' + run.node + ') ' : run.request_id + ' ';
    list.append(a);
  }
});
