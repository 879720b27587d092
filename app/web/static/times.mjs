// times.mjs: how the page shows a time of the service: the reader's local time and how long ago ("3 s ago"),
// with the exact ISO 8601 value (UTC, as the API sends it) on hover, in a <time> element.

const FORMAT = { year: "numeric", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit" };
const UNITS = [[60, "min"], [60, "h"], [24, "d"]]; // from seconds up: 60 s is 1 min, 60 min 1 h, 24 h 1 d

/** The time in the reader's zone and locale, e.g. "2 Dec 2026, 07:05:39". */
export function localTime(iso) {
  return new Date(iso).toLocaleString(undefined, FORMAT);
}

/** "3 s ago", "5 min ago", "2 h ago", "4 d ago"; "in 30 s" ahead. Within a second either way (the service's
 * clock and this one differ a little) is "0 s ago". */
export function relative(ms) {
  const ahead = ms >= 1000;
  let value = Math.floor(Math.abs(ms) / 1000);
  let unit = "s";
  for (const [size, name] of UNITS) {
    if (value < size) break;
    value = Math.floor(value / size);
    unit = name;
  }
  return ahead ? `in ${value} ${unit}` : `${value} ${unit} ago`;
}

function when(iso) {
  return `${localTime(iso)} (${relative(Date.parse(iso) - Date.now())})`;
}

/** A <time> element for `iso`: local time and how long ago, the exact value as its title. */
export function timeOf(iso) {
  const element = document.createElement("time");
  element.dateTime = iso;
  element.title = iso;
  element.textContent = when(iso);
  return element;
}

/** Count every shown time on ("3 s ago" becomes "4 s ago"): the page calls it every second. */
export function tick() {
  for (const element of document.querySelectorAll("time[datetime]")) element.textContent = when(element.dateTime);
}
