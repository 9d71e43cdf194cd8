/**
 * Small text helpers: durations, relative times, clock times, GPU memory, job labels.
 *
 * Clock times follow the browser's locale everywhere in the UI (panel, dashboard, charts): a
 * 24-hour locale (en-GB, de-DE, ...) reads 14:39, a 12-hour one (en-US) 2:39 PM. The charts'
 * time formats come from `chartTimeFormats()`, so Vega's axes and tooltips agree with the text.
 */
import { IJob } from './api';

export function formatDuration(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined || !isFinite(seconds)) {
    return '—';
  }
  let s = Math.max(0, Math.round(seconds));
  const d = Math.floor(s / 86400);
  s -= d * 86400;
  const h = Math.floor(s / 3600);
  s -= h * 3600;
  const m = Math.floor(s / 60);
  s -= m * 60;
  if (d > 0) {
    return h ? `${d}d ${h}h` : `${d}d`;
  }
  if (h > 0) {
    return m ? `${h}h ${pad(m)}m` : `${h}h`;
  }
  if (m > 0) {
    return s ? `${m}m ${pad(s)}s` : `${m}m`;
  }
  return `${s}s`;
}

function pad(n: number): string {
  return n < 10 ? `0${n}` : `${n}`;
}

/** "in 3m 10s", "now", or "unknown" for an epoch-seconds time. */
export function formatStart(
  epoch: number | null | undefined,
  now: number,
  kind?: 'bound' | 'prediction' | null,
  span?: [number, number] | null
): string {
  // an expected start that passed while the job waits is known to be wrong (as model.format_expected_start)
  if (epoch === null || epoch === undefined || epoch < now - 60) {
    return 'unknown';
  }
  const delta = epoch - now;
  const wide = !!span && span[1] - span[0] >= 60 && span[1] - now >= 60;
  if (delta <= 1 && !wide) {
    return 'now';
  }
  const rel = `in ${formatDuration(delta)}`;
  if (!kind) {
    return rel;
  }
  // as the engine words it: a prediction from past runtimes, or a bound from time limits
  const clock = formatClock(epoch, delta >= 20 * 3600);
  if (span && wide) {
    // its range: "14:20-15:05 (about 14:40, in 24m)"; a bound is the range's end:
    // "by 15:05 at the latest (in 49m; from 14:20)"
    const lo = Math.max(span[0], now);
    const first = lo - now < 60 ? 'now' : formatClock(lo, lo - now >= 20 * 3600);
    const last = formatClock(span[1], span[1] - now >= 20 * 3600);
    if (kind === 'prediction') {
      return delta <= 1 ? `${first}-${last} (likely now)` : `${first}-${last} (about ${clock}, ${rel})`;
    }
    return `by ${clock} at the latest (${rel}; from ${first})`;
  }
  return kind === 'prediction' ? `about ${clock} (${rel})` : `by ${clock} at the latest (${rel})`;
}

/** Whether the browser's locale reads clock times on a 24-hour dial. */
export function uses24Hour(): boolean {
  // hourCycle: h23 / h24 on a 24-hour dial (not in this TypeScript's lib yet)
  const options = new Intl.DateTimeFormat(undefined, { hour: 'numeric' }).resolvedOptions() as { hourCycle?: string };
  const cycle = options.hourCycle;
  if (cycle) {
    return cycle === 'h23' || cycle === 'h24';
  }
  return new Date(2000, 0, 1, 13).toLocaleTimeString(undefined, { hour: 'numeric' }).includes('13');
}

/** An epoch-seconds time on the browser locale's clock: "14:39" or "2:39 PM", with the
 * weekday ("Fri 14:39") when asked. */
export function formatClock(epoch: number, weekday = false): string {
  return new Date(epoch * 1000).toLocaleString(undefined, {
    ...(weekday ? { weekday: 'short' } : {}),
    hour: uses24Hour() ? '2-digit' : 'numeric',
    minute: '2-digit'
  });
}

/** Vega time formats on the locale's clock: `axis` a multi-format of the charts' time axes
 * (the hour "14:00" or "2 PM", minutes "14:15" or "2:15", days "Fri 04"), `minute` and
 * `second` the tooltips' times. */
export function chartTimeFormats(): { axis: { [unit: string]: string }; minute: string; second: string } {
  const h24 = uses24Hour();
  return h24
    ? {
        axis: { seconds: ':%S', minutes: '%H:%M', hours: '%H:%M', date: '%a %d', day: '%a %d' },
        minute: '%a %H:%M',
        second: '%a %H:%M:%S'
      }
    : {
        axis: { seconds: ':%S', minutes: '%-I:%M', hours: '%-I %p', date: '%a %d', day: '%a %d' },
        minute: '%a %-I:%M %p',
        second: '%a %-I:%M:%S %p'
      };
}

/** Coarse: "4m", "1h 05m", "now" (for narrow tables); "~4m" for a prediction, "≤4m" for a bound. */
export function formatStartShort(
  epoch: number | null | undefined,
  now: number,
  kind?: 'bound' | 'prediction' | null
): string {
  if (epoch === null || epoch === undefined) {
    return '?';
  }
  const delta = epoch - now;
  if (delta <= 1) {
    return 'now';
  }
  const mark = kind === 'prediction' ? '~' : kind === 'bound' ? '≤' : '';
  if (delta < 60) {
    return `${mark}${Math.round(delta)}s`;
  }
  if (delta < 3600) {
    return `${mark}${Math.round(delta / 60)}m`;
  }
  return mark + formatDuration(Math.round(delta / 60) * 60);
}

export function formatAgo(epoch: number | null | undefined, now: number): string {
  if (!epoch) {
    return '';
  }
  const delta = now - epoch;
  if (delta < 5) {
    return 'just now';
  }
  return `${formatDuration(delta)} ago`;
}

export function formatGiB(mb: number): string {
  const gib = mb / 1024;
  if (gib >= 100) {
    return gib.toFixed(0);
  }
  return gib >= 10 ? gib.toFixed(0) : gib.toFixed(1);
}

export function jobLabel(job: IJob): string {
  return job.name ? job.name : `${job.kind} job`;
}

export function gpuRequest(job: IJob): string {
  if (!job.gpus) {
    return 'no GPU';
  }
  if (job.share || job.gpu_memory) {
    // a share of one GPU, as the kernelspec names it: "0.5 of a GPU", "16 GiB of A100"
    const part = job.gpu_memory ? `${formatGiB(job.gpu_memory / (1 << 20))} GiB` : `${job.share}`;
    return `${part} of ${job.gpu_type || 'a GPU'}`;
  }
  return `${job.gpus}×${job.gpu_type || 'any GPU'}`;
}

export function stateLabel(state: string): string {
  return state.charAt(0) + state.slice(1).toLowerCase();
}

/** Why a finished job ended, in words a person can act on. */
export function endReason(job: IJob): string {
  if (job.reason) {
    return job.reason;
  }
  if (job.exit_code !== null && job.exit_code !== undefined) {
    return `exit code ${job.exit_code}`;
  }
  return '';
}

export function nowSeconds(): number {
  return Date.now() / 1000;
}
