/**
 * The REST API and websocket of the jupyter-gpujobs server extension
 * (`{base_url}gpujobs/api/`), typed. Every request goes through
 * ServerConnection.makeRequest so the token / XSRF cookie of the server is used,
 * and every URL is built from the server's baseUrl so the UI works under a
 * non-root base_url (JupyterHub).
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

export const API_PATH = 'gpujobs/api';

export type JobState =
  | 'PENDING'
  | 'HELD'
  | 'RUNNING'
  | 'COMPLETED'
  | 'FAILED'
  | 'CANCELLED'
  | 'TIMEOUT'
  | 'LOST';

export const FINAL_STATES: ReadonlySet<string> = new Set([
  'COMPLETED',
  'FAILED',
  'CANCELLED',
  'TIMEOUT',
  'LOST'
]);

export interface IGPU {
  index: number;
  uuid: string;
  name: string;
  host: string;
  memory_total_mb: number;
  /** Memory used by processes: never the driver's own reservation. */
  memory_used_mb: number;
  /** Memory the driver keeps for itself (nvidia-smi's memory.reserved), shown apart. */
  memory_reserved_mb?: number;
  utilization: number;
  healthy?: boolean;
  draining?: boolean;
  job_id: number | null;
  user: string | null;
  /** In use outside the queue (busy for the queue): by what, e.g. "in use outside the queue (2.1 GiB held by pid 4242, python, user bob)". */
  foreign?: string | null;
  /** What to do about that use. */
  foreign_todo?: string | null;
  /** The admin who let the queue hand it out all the same. */
  foreign_override?: string | null;
  /** Who holds how much of it: each running job on it; several on a shared GPU. */
  holders?: IGPUHolder[];
}

export interface IGPUHolder {
  job_id: number;
  user: string;
  /** The part of the card the job holds (0-1); null: the whole card. */
  share: number | null;
  memory_mb: number;
  used_mb: number | null;
}

/** An advance reservation (`GET reservations`) with its active or next occurrence. */
export interface IReservation {
  id: number;
  name: string;
  label: string;
  gpus: number;
  gpu_type: string | null;
  host: string | null;
  start: number;
  duration_s: number;
  repeat: 'daily' | 'weekly' | null;
  users: string[];
  groups: string[];
  holders: string;
  created_by: string;
  next_start: number | null;
  next_end: number | null;
  active: boolean;
  assigned: { host: string; gpus: number[]; text: string } | null;
}

/** My notification settings (`GET notifications`). */
export interface INotifications {
  user: string;
  email: string | null;
  webhook: string | null;
  events: string[];
  updated_at: number | null;
  email_available: boolean;
  kinds: string[];
  webhook_hosts: string[];
}

export interface IGPUInventory {
  gpus: IGPU[];
  backend: string;
  /** What confines each job here, e.g. "GPU fence: device cgroup; ...". */
  isolation?: string;
}

export interface IJob {
  id: number;
  name: string | null;
  user: string;
  kind: string;
  state: JobState;
  gpus: number;
  gpu_type: string | null;
  /** A part of one GPU (0.5), or its memory in bytes: the job shares that GPU; null: whole GPUs. */
  share?: number | null;
  gpu_memory?: number | null;
  /** A pending job kept from starting until released (its state is HELD). */
  held?: boolean;
  /** Retries of a failed run: how many it may have, and how many started. */
  retries?: number;
  retried?: number;
  assigned_gpus: number[];
  host: string | null;
  submitted_at: number;
  started_at: number | null;
  ended_at: number | null;
  time_limit_s: number | null;
  exit_code: number | null;
  signal?: number | null;
  reason: string | null;
  position: number | null;
  expected_start: number | null;
  /** "prediction" (from past runtimes) or "bound" (from time limits); null without an estimate */
  expected_start_kind?: 'bound' | 'prediction' | null;
  /** [earliest, latest] of the expected start (the spread of past runtimes); null without one */
  expected_start_range?: [number, number] | null;
  /** why the expected start moved (e.g. a job ahead running past its predicted end) */
  expected_start_note?: string | null;
  priority: string;
  group: string | null;
  preemptible: boolean;
  borrowed: boolean;
  command: string | string[] | null;
  payload: { [key: string]: any } | null;
  output_notebook: string | null;
  /** Epoch seconds, while it runs with a time limit: when it reaches it, and when it is warned. */
  ends_at?: number | null;
  warn_at?: number | null;
  /** Right-sizing advice, to the owner, when asked for (`api.job(id, true)`); null: no earlier runs. */
  advice?: IAdvice | null;
}

/** What a user's own earlier finished runs of a job's name used, and a smaller request (docs/what-if.md). */
export interface IAdvice {
  runs: number;
  job_ids: number[];
  peak_gpu_memory_mb: number | null;
  mean_utilization: number | null;
  longest_run_s: number;
  /** Only the fields that change: a share (gpus below 1) and/or a time limit; null: the request fits. */
  suggest: { gpus?: number; time_limit_s?: number } | null;
  used: string;
  /** "3 earlier runs: used <= 18 GB, ran <= 40m of 4h: a 0.25 share with 1h would start now" */
  text: string;
  expected_start?: number | null;
}

/** A nearby choice of a what-if, and when it would start. */
export interface IWhatIfChoice {
  gpus: number;
  gpu_type: string | null;
  time_limit_s: number;
  gpu_memory: number | null;
  change?: string;
  expected_start: number | null;
}

/** The answer of `POST jobs?dry_run=1`: nothing was submitted. */
export interface IWhatIf {
  dry_run: true;
  /** What was asked, as the engine read it (no start: that is `expected_start`). */
  request: Omit<IWhatIfChoice, 'expected_start'>;
  tasks: number;
  now: number;
  expected_start: number | null;
  /** "bound": from time limits, as the scheduler books (sooner if the jobs ahead end sooner) */
  expected_start_kind?: 'bound' | null;
  alternatives: IWhatIfChoice[];
  advice: IAdvice | null;
  basis?: string;
}

export interface IJobEvent {
  job_id: number;
  time: number;
  state: string;
  actor: string;
  reason: string;
  data?: { [key: string]: any };
}

export interface IQuota {
  user: string;
  running_gpus: number;
  running_jobs: number;
  pending_jobs: number;
  pending_gpus?: number;
  borrowed_gpus: number;
  guaranteed_gpus: number;
  max_gpus: number | null;
  max_running_jobs: number | null;
  max_time_limit_s: number | null;
  total_gpus?: number;
  groups?: { [name: string]: any };
  budgets?: IBudget[];
}

/** A GPU-hour budget the user draws on (an item of `GET budgets`, and of `quota.budgets`). */
export interface IBudget {
  scope: 'users' | 'groups';
  name: string;
  gpu_hours: number;
  period: 'week' | 'month' | 'dates';
  mode: 'hold' | 'low';
  in_force: boolean;
  used_gpu_hours: number;
  left_gpu_hours: number;
  percent: number;
  used_up: boolean;
  period_start: number | null;
  period_end: number | null;
}

export interface IWhoAmI {
  user: string;
  admin: boolean;
}

/** A monitor finding (an item of `GET findings`): an idle GPU, an OOM, repeated failures... */
export interface IFinding {
  id: number;
  kind: string;
  key: string;
  severity: 'info' | 'warning' | 'error';
  time: number;
  last_seen: number;
  resolved_at: number | null;
  open: boolean;
  job_id: number | null;
  user: string | null;
  host: string | null;
  gpu: number | null;
  pid: number | null;
  action: string;
  message: string;
  data: { [key: string]: any };
}

export type SocketMessage =
  | { type: 'job'; job: IJob; event: IJobEvent }
  | { type: 'gpus'; gpus: IGPU[] }
  | { type: 'finding'; finding: IFinding };

/** An error answer of the API (or no answer at all), with what a person can do about it. */
export class APIError extends Error {
  constructor(
    message: string,
    readonly status: number,
    readonly field: string | null = null
  ) {
    super(message);
  }

  /** The engine is not there at all: no server, or the server extension is not loaded. */
  get unreachable(): boolean {
    return this.status === 0 || this.status === 404 || this.status >= 502;
  }
}

export function apiUrl(
  endpoint: string,
  settings?: ServerConnection.ISettings
): string {
  const s = settings ?? ServerConnection.makeSettings();
  return URLExt.join(s.baseUrl, API_PATH, endpoint);
}

export async function requestAPI<T>(
  endpoint: string,
  init: RequestInit = {},
  settings?: ServerConnection.ISettings
): Promise<T> {
  const s = settings ?? ServerConnection.makeSettings();
  const url = apiUrl(endpoint, s);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, s);
  } catch (error) {
    throw new APIError(
      'Cannot reach the Jupyter server: check that it is still running and that this page is connected to it.',
      0
    );
  }
  const text = await response.text();
  let data: any = null;
  if (text.length > 0) {
    try {
      data = JSON.parse(text);
    } catch {
      data = null;
    }
  }
  if (!response.ok) {
    if (response.status === 404 && !(data && data.message)) {
      throw new APIError(
        'The GPU job engine is not running in this Jupyter server (gpujobs/api answered 404). ' +
          'Enable it with `jupyter server extension enable jupyter_gpujobs` and restart JupyterLab.',
        404
      );
    }
    const message =
      (data && (data.message || data.reason)) ||
      `${response.status} ${response.statusText}`;
    throw new APIError(message, response.status, data ? data.field ?? null : null);
  }
  return data as T;
}

export interface ISubmitNotebook {
  kind: 'notebook';
  name: string;
  gpus: number;
  gpu_type: string | null;
  time_limit: string | null;
  priority: string;
  /** a signal before the end, "USR1@5m" (docs/long-jobs.md) */
  signal?: string;
  /** back to the queue at the time limit (and after a preemption): resumes after its last completed cell */
  requeue?: boolean;
  /** nodes of a multi-node job, `gpus` on each (the Slurm runner only; otherwise a 400 naming nodes) */
  nodes?: number;
  /** the container image it runs in (docs/containers.md); absent: the site's default (or the host) */
  image?: string;
  payload: { notebook: string; parameters: { [key: string]: any } };
}

/** GPU readings of one GPU in one bucket of `step` seconds (`GET gpus/samples?step=`). */
export interface ISampleBucket {
  host: string;
  gpu: number;
  time: number;
  step: number;
  count: number;
  utilization: number | null;
  utilization_max: number | null;
  memory_used_mb: number | null;
  memory_used_max_mb: number | null;
  memory_total_mb: number | null;
}

/** GPU-hours by user, group or GPU model (`GET usage`). */
export interface IUsage {
  since: number;
  until: number;
  by: string;
  rows: { key: string; gpu_hours: number; jobs: number }[];
  total_gpu_hours: number;
}

/** Mean utilization by weekday x hour of the server's local time (`GET usage/heatmap`). */
export interface IHeatmap {
  since: number;
  until: number;
  timezone: string;
  weekdays: string[];
  hours: number[];
  utilization: (number | null)[][];
  samples: number[][];
}

/** The queue over time (`GET usage/queue`). */
export interface IQueueHistory {
  since: number;
  until: number;
  step: number;
  points: {
    time: number;
    queue_length: number;
    started: number;
    wait_mean_s: number | null;
    wait_p90_s: number | null;
  }[];
}

/** How many jobs of the queue the panel shows (the server pages `GET queue`). */
export const QUEUE_PAGE = 50;

export const api = {
  whoami: () => requestAPI<IWhoAmI>('whoami'),
  gpus: () => requestAPI<IGPUInventory>('gpus'),
  jobs: (user: string, limit = 50) =>
    requestAPI<{ jobs: IJob[]; next: number | null }>(
      `jobs?user=${encodeURIComponent(user)}&limit=${limit}`
    ),
  job: (id: number, advice = false) => requestAPI<IJob>(`jobs/${id}${advice ? '?advice=1' : ''}`),
  /** The first `limit` pending jobs in scheduling order, and how many are pending in all. */
  queue: (limit = QUEUE_PAGE) =>
    requestAPI<{ jobs: IJob[]; total: number; offset: number; next: number | null; held?: number }>(
      `queue?limit=${limit}`
    ),
  quota: () => requestAPI<IQuota>('quota'),
  cancel: (id: number) => requestAPI<IJob>(`jobs/${id}`, { method: 'DELETE' }),
  /** Keep a pending job from starting (HELD) until released, and release it. */
  hold: (id: number) => requestAPI<IJob>(`jobs/${id}/hold`, { method: 'POST' }),
  release: (id: number) => requestAPI<IJob>(`jobs/${id}/release`, { method: 'POST' }),
  submit: (body: ISubmitNotebook) =>
    requestAPI<IJob>('jobs', { method: 'POST', body: JSON.stringify(body) }),
  /** When the request would start, nearby choices, advice: checked as a submission, nothing submitted. */
  whatIf: (body: ISubmitNotebook) =>
    requestAPI<IWhatIf>('jobs?dry_run=1', { method: 'POST', body: JSON.stringify(body) }),
  log: (id: number, offset: number) =>
    requestAPI<{ offset: number; data: string; done: boolean }>(
      `jobs/${id}/log?offset=${offset}`
    ),
  /** GPU readings since `since` seconds ago, per GPU in buckets of `step` seconds. */
  samples: (span: number, step: number) =>
    requestAPI<{ samples: ISampleBucket[]; step: number }>(
      `gpus/samples?since=${Math.round(span)}s&step=${step}`
    ),
  usage: (span: number, by: 'user' | 'group' | 'model') =>
    requestAPI<IUsage>(`usage?since=${Math.round(span)}s&by=${by}`),
  heatmap: (span: number) => requestAPI<IHeatmap>(`usage/heatmap?since=${Math.round(span)}s`),
  queueHistory: (span: number, step: number) =>
    requestAPI<IQueueHistory>(`usage/queue?since=${Math.round(span)}s&step=${step}`),
  reservations: () => requestAPI<{ reservations: IReservation[] }>('reservations'),
  notifications: () => requestAPI<INotifications>('notifications'),
  setNotifications: (body: { email?: string | null; webhook?: string | null; events?: string[] }) =>
    requestAPI<INotifications>('notifications', { method: 'PUT', body: JSON.stringify(body) }),
  notificationsOff: () => requestAPI<INotifications>('notifications', { method: 'DELETE' }),
  testNotifications: () =>
    requestAPI<{ queued: string[] }>('notifications/test', { method: 'POST', body: '{}' }),
  findings: (openOnly = true) =>
    requestAPI<{ findings: IFinding[] }>(`findings?open=${openOnly ? 1 : 0}&limit=500`),
  resolveFinding: (id: number) =>
    requestAPI<IFinding>('findings/resolve', { method: 'POST', body: JSON.stringify({ id }) }),
  drain: (host: string, gpu: number, draining: boolean, reason: string) =>
    requestAPI<{ gpus: IGPU[] }>('gpus/drain', {
      method: 'POST',
      body: JSON.stringify({ host, gpu, draining, reason })
    })
};

/** The websocket URL of the event feed, with the token where the server wants it in the URL. */
export function eventsUrl(settings?: ServerConnection.ISettings): string {
  const s = settings ?? ServerConnection.makeSettings();
  let url = URLExt.join(s.wsUrl, API_PATH, 'events');
  if (s.token && (s as any).appendToken !== false) {
    url += `?token=${encodeURIComponent(s.token)}`;
  }
  return url;
}
