// The overview's live list (served from the binary at /console/static/live.js): the server says
// over server-sent events when a run starts or ends, so the page never polls.
const live = new EventSource('/api/live');
live.addEventListener('runs', (e) => {
  const runs = JSON.parse(e.data).active;
  document.getElementById('active').textContent = runs.length;
  const list = document.getElementById('running');
  list.replaceChildren();
  for (const id of runs) {
    const a = document.createElement('a');
    a.href = '/console/runs/' + encodeURIComponent(id);
    a.textContent = id + ' ';
    list.append(a);
  }
});
