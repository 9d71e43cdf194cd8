/**
 * The one client-side state of the UI: GPUs, my jobs, the queue, my quota.
 *
 * Kept live by the websocket `gpujobs/api/events` (reconnecting with backoff) and refreshed
 * every few seconds as a fallback. It computes nothing the server already knows; it only
 * notices state changes of my jobs so the notifications can tell about them.
 */
import { ISignal, Signal } from '@lumino/signaling';
import {
  APIError,
  FINAL_STATES,
  IFinding,
  IGPU,
  IJob,
  IJobEvent,
  INotifications,
  IQuota,
  IReservation,
  SocketMessage,
  api,
  eventsUrl
} from './api';

export type Connection = 'connecting' | 'live' | 'reconnecting' | 'closed';

export interface IJobChange {
  job: IJob;
  previous: string | null;
  state: string;
  reason: string;
  event: IJobEvent | null;
}

export class GPUJobsModel {
  user: string | null = null;
  admin = false;
  gpus: IGPU[] = [];
  backend = '';
  /** What confines each job on this engine (one line from GET gpus). */
  isolation = '';
  myJobs: IJob[] = [];
  /** The head of the queue (one page); `queueTotal` jobs are pending in all. */
  queue: IJob[] = [];
  queueTotal = 0;
  /** Of those, how many are held (they start only once released). */
  queueHeld = 0;
  quota: IQuota | null = null;
  /** Advance reservations (none on an engine without them). */
  reservations: IReservation[] = [];
  /** My e-mail / webhook notifications; null where the engine has none to offer. */
  notifications: INotifications | null = null;
  /** null until the first answer; then the last error or null. */
  error: APIError | null = null;
  loaded = false;
  connection: Connection = 'connecting';

  constructor(refreshSeconds = 5) {
    this._refreshSeconds = refreshSeconds;
  }

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** The monitor opened a finding about a job of mine (once per finding, from the websocket). */
  get findingOpened(): ISignal<this, IFinding> {
    return this._findingOpened;
  }

  /** Every message of the events websocket, as it arrives (the dashboard follows them). */
  get message(): ISignal<this, SocketMessage> {
    return this._message;
  }

  /** A job of mine changed state (or got a time-limit warning). */
  get jobChanged(): ISignal<this, IJobChange> {
    return this._jobChanged;
  }

  get isDisposed(): boolean {
    return this._disposed;
  }

  get runningCount(): number {
    return this.myJobs.filter(j => j.state === 'RUNNING').length;
  }

  get pendingCount(): number {
    return this.myJobs.filter(j => j.state === 'PENDING').length;
  }

  get heldCount(): number {
    return this.myJobs.filter(j => j.state === 'HELD').length;
  }

  set refreshSeconds(value: number) {
    this._refreshSeconds = Math.max(1, value || 5);
    this._schedulePoll();
  }

  start(): void {
    void this.refresh();
    this._connect();
    this._schedulePoll();
  }

  dispose(): void {
    this._disposed = true;
    window.clearInterval(this._pollTimer);
    window.clearTimeout(this._reconnectTimer);
    window.clearTimeout(this._refreshSoon);
    if (this._socket) {
      this._socket.onclose = null;
      this._socket.close();
    }
    Signal.clearData(this);
  }

  /** Re-read everything from the REST API. */
  async refresh(): Promise<void> {
    if (this._refreshing) {
      this._refreshAgain = true;
      return this._refreshing;
    }
    this._refreshing = this._doRefresh();
    try {
      await this._refreshing;
    } finally {
      this._refreshing = null;
      if (this._refreshAgain) {
        this._refreshAgain = false;
        void this.refresh();
      }
    }
  }

  /** Re-read my notification settings (after a change). */
  async refreshNotifications(): Promise<void> {
    try {
      this.notifications = await api.notifications();
    } catch {
      this.notifications = null; // an engine without notifications
    }
    this._changed.emit();
  }

  /** Hold a pending job (`hold`) or release a held one. */
  async hold(id: number, hold: boolean): Promise<IJob> {
    const job = await (hold ? api.hold(id) : api.release(id));
    this._mergeJob(job, null);
    this._changed.emit();
    this.refreshSoon();
    return job;
  }

  async cancel(id: number): Promise<IJob> {
    const job = await api.cancel(id);
    this._mergeJob(job, null);
    this._changed.emit();
    this.refreshSoon();
    return job;
  }

  job(id: number): IJob | undefined {
    return this.myJobs.find(j => j.id === id);
  }

  /** Coalesce the refreshes that many events in a row ask for. */
  refreshSoon(delay = 150): void {
    window.clearTimeout(this._refreshSoon);
    this._refreshSoon = window.setTimeout(() => void this.refresh(), delay);
  }

  private async _doRefresh(): Promise<void> {
    try {
      if (!this.user) {
        const me = await api.whoami();
        this.user = me.user;
        this.admin = me.admin;
      }
      const [inventory, jobs, queue, quota, reservations] = await Promise.all([
        api.gpus(),
        api.jobs(this.user!),
        api.queue(),
        api.quota(),
        api.reservations().then(
          r => r.reservations,
          () => [] as IReservation[] // an engine without reservations
        )
      ]);
      this.reservations = reservations;
      if (!this._notificationsAsked) {
        this._notificationsAsked = true;
        await this.refreshNotifications();
      }
      this.gpus = inventory.gpus;
      this.backend = inventory.backend;
      this.isolation = inventory.isolation || '';
      this.queue = queue.jobs;
      this.queueTotal = queue.total;
      this.queueHeld = queue.held ?? 0;
      this.quota = quota;
      const fresh = jobs.jobs.map(job => {
        const mine = this.myJobs.find(j => j.id === job.id);
        return mine && FINAL_STATES.has(mine.state) && !FINAL_STATES.has(job.state) ? mine : job;
      });
      for (const job of fresh) {
        this._noticeChange(job, null);
      }
      this.myJobs = sortJobs(fresh);
      // After the first answer, jobs we have not seen before are news.
      this._primed = true;
      this.error = null;
    } catch (error) {
      this.error =
        error instanceof APIError
          ? error
          : new APIError(String((error as Error)?.message ?? error), 0);
    }
    this.loaded = true;
    if (!this._disposed) {
      this._changed.emit();
    }
  }

  private _mergeJob(job: IJob, event: IJobEvent | null): void {
    this._noticeChange(job, event);
    const others = this.myJobs.filter(j => j.id !== job.id);
    this.myJobs = sortJobs([job, ...others]);
  }

  private _noticeChange(job: IJob, event: IJobEvent | null): void {
    if (this.user && job.user !== this.user) {
      return;
    }
    const previous = this._known.get(job.id) ?? null;
    if (event && event.state === 'WARNING') {
      this._emitOnce({ job, previous, state: 'WARNING', reason: event.reason, event });
      return;
    }
    // A REST answer that left before the websocket event is older news: never go back
    // from a final state.
    if (previous !== null && FINAL_STATES.has(previous) && !FINAL_STATES.has(job.state)) {
      return;
    }
    this._known.set(job.id, job.state);
    // Jobs already there at the first load are history, not news.
    const isNew = previous === null && this._primed;
    if ((previous !== null && previous !== job.state) || (isNew && job.state !== 'PENDING')) {
      this._emitOnce({
        job,
        previous,
        state: job.state,
        reason: job.reason || (event && event.reason) || '',
        event
      });
    }
  }

  /** One notification per job and state (a requeued job may run again: keyed by start). */
  private _emitOnce(change: IJobChange): void {
    const key = `${change.job.id}:${change.state}:${change.job.started_at ?? ''}:${
      change.state === 'WARNING' ? change.reason : ''
    }`;
    if (this._emitted.has(key)) {
      return;
    }
    this._emitted.add(key);
    this._jobChanged.emit(change);
  }

  private _onMessage(message: SocketMessage): void {
    this._message.emit(message);
    if (message.type === 'gpus') {
      this.gpus = message.gpus;
      this._changed.emit();
      return;
    }
    if (message.type === 'finding') {
      this._noticeFinding(message.finding);
      return;
    }
    if (message.type === 'job') {
      const job = message.job;
      if (job.user === this.user) {
        this._mergeJob(job, message.event);
      }
      // The queue positions, estimates and quota follow from the change: ask the server.
      this._changed.emit();
      this.refreshSoon();
    }
  }

  /**
   * Admins hear of every finding; news to me are those about my jobs (and a process on a GPU
   * my job holds).
   */
  private _noticeFinding(finding: IFinding): void {
    const mine =
      this.user !== null &&
      ((finding.job_id !== null && finding.user === this.user) ||
        finding.data?.holder_user === this.user);
    if (!finding.open || !mine || this._findingsSeen.has(finding.id)) {
      return;
    }
    this._findingsSeen.add(finding.id);
    this._findingOpened.emit(finding);
  }

  private _connect(): void {
    if (this._disposed) {
      return;
    }
    let socket: WebSocket;
    try {
      socket = new WebSocket(eventsUrl());
    } catch {
      this._scheduleReconnect();
      return;
    }
    this._socket = socket;
    socket.onopen = () => {
      this._backoff = 1000;
      this.connection = 'live';
      this._changed.emit();
      // Whatever happened while we were away.
      void this.refresh();
    };
    socket.onmessage = (msg: MessageEvent) => {
      try {
        this._onMessage(JSON.parse(msg.data) as SocketMessage);
      } catch (error) {
        console.warn('gpujobs: bad event message', error);
      }
    };
    socket.onclose = () => {
      this._socket = null;
      if (this._disposed) {
        return;
      }
      this.connection = 'reconnecting';
      this._changed.emit();
      this._scheduleReconnect();
    };
  }

  private _scheduleReconnect(): void {
    window.clearTimeout(this._reconnectTimer);
    const delay = this._backoff * (0.75 + Math.random() * 0.5);
    this._backoff = Math.min(this._backoff * 2, 30000);
    this._reconnectTimer = window.setTimeout(() => this._connect(), delay);
  }

  private _schedulePoll(): void {
    window.clearInterval(this._pollTimer);
    this._pollTimer = window.setInterval(
      () => void this.refresh(),
      this._refreshSeconds * 1000
    );
  }

  private _changed = new Signal<this, void>(this);
  private _message = new Signal<this, SocketMessage>(this);
  private _jobChanged = new Signal<this, IJobChange>(this);
  private _findingOpened = new Signal<this, IFinding>(this);
  private _findingsSeen = new Set<number>();
  private _known = new Map<number, string>();
  private _emitted = new Set<string>();
  private _primed = false;
  private _notificationsAsked = false;
  private _disposed = false;
  private _socket: WebSocket | null = null;
  private _backoff = 1000;
  private _reconnectTimer = 0;
  private _pollTimer = 0;
  private _refreshSoon = 0;
  private _refreshSeconds: number;
  private _refreshing: Promise<void> | null = null;
  private _refreshAgain = false;
}

const ORDER: { [state: string]: number } = { RUNNING: 0, PENDING: 1, HELD: 1 };

/** Running first, then pending, then the finished ones, newest first within each. */
export function sortJobs(jobs: IJob[]): IJob[] {
  return [...jobs].sort((a, b) => {
    const oa = ORDER[a.state] ?? (FINAL_STATES.has(a.state) ? 2 : 3);
    const ob = ORDER[b.state] ?? (FINAL_STATES.has(b.state) ? 2 : 3);
    return oa - ob || b.id - a.id;
  });
}
