/**
 * The GPU dashboard (a main-area view): GPU utilization and memory over the last hour, day or
 * week, the weekday x hour heatmap, GPU-hours per user and group, the queue's length and waits,
 * and the monitor's open findings with their actions.
 *
 * DashboardModel reads the monitor's REST endpoints and follows the events websocket through
 * GPUJobsModel: GPU readings are appended as they arrive, findings open and close live, and a
 * job event re-reads usage and the queue trend. Everything is also re-read on a timer.
 */
import * as React from 'react';
import { ReactWidget, UseSignal } from '@jupyterlab/ui-components';
import { ISignal, Signal } from '@lumino/signaling';
import type { VisualizationSpec } from 'vega-embed';
import {
  APIError,
  IFinding,
  IGPU,
  IHeatmap,
  IQueueHistory,
  ISampleBucket,
  IUsage,
  SocketMessage,
  api
} from './api';
import { VegaChart } from './charts';
import { chartTimeFormats, formatAgo, formatDuration, formatGiB, nowSeconds } from './format';
import { chartIcon } from './icons';
import { GPUJobsModel } from './model';
import { Reservations } from './panel';

export type Range = 'hour' | 'day' | 'week';

/** Span, bucket and re-read period (seconds) of each range. */
export const RANGES: { [r in Range]: { label: string; span: number; step: number; every: number } } = {
  hour: { label: 'Last hour', span: 3600, step: 30, every: 30 },
  day: { label: 'Last day', span: 86400, step: 600, every: 120 },
  week: { label: 'Last week', span: 7 * 86400, step: 3600, every: 600 }
};

const HEATMAP_SPAN = 7 * 86400;

/** A point of the GPU charts: one GPU at one time. */
export interface IGPUPoint {
  t: number; // ms, for Vega's time scale
  gpu: string;
  util: number | null;
  util_max: number | null;
  mem: number | null; // GiB
  total: number | null; // GiB
  /** A break in the line: no readings between its neighbours (the server was down). */
  gap?: boolean;
}

/** A GPU with no reading for this many buckets (or seconds, the larger) had none at all: the
 * server was down. The charts break their lines there instead of drawing across. */
const GAP_BUCKETS = 3;
const GAP_MIN_S = 90;

export class DashboardModel {
  range: Range = 'hour';
  gpuPoints: IGPUPoint[] = [];
  heatmap: IHeatmap | null = null;
  byUser: IUsage | null = null;
  byGroup: IUsage | null = null;
  queue: IQueueHistory | null = null;
  findings: IFinding[] = [];
  error: APIError | null = null;
  loaded = false;
  /** Findings being acted on (their buttons wait). */
  busy = new Set<number>();

  constructor(readonly jobs: GPUJobsModel) {
    jobs.message.connect(this._onMessage, this);
    jobs.changed.connect(this._onJobsChanged, this);
  }

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  get isDisposed(): boolean {
    return this._disposed;
  }

  start(): void {
    void this.refresh();
    this._schedule();
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    window.clearInterval(this._timer);
    window.clearTimeout(this._soon);
    Signal.disconnectAll(this);
    this.jobs.message.disconnect(this._onMessage, this);
    this.jobs.changed.disconnect(this._onJobsChanged, this);
  }

  setRange(range: Range): void {
    if (range === this.range) {
      return;
    }
    this.range = range;
    this.gpuPoints = [];
    this._emit();
    this._schedule();
    void this.refresh();
  }

  /** Re-read every chart and the findings. */
  async refresh(): Promise<void> {
    const { span, step } = RANGES[this.range];
    const range = this.range;
    try {
      const [samples, heatmap, byUser, byGroup, queue, findings] = await Promise.all([
        api.samples(span, step),
        api.heatmap(HEATMAP_SPAN),
        api.usage(span, 'user'),
        api.usage(span, 'group'),
        api.queueHistory(span, step),
        api.findings(true)
      ]);
      if (range !== this.range) {
        return; // the range changed meanwhile: its own refresh brings its data
      }
      this.gpuPoints = withGaps(samples.samples.map(bucketPoint), step);
      this.heatmap = heatmap;
      this.byUser = byUser;
      this.byGroup = byGroup;
      this.queue = queue;
      this.findings = sortFindings(findings.findings);
      this.error = null;
    } catch (error) {
      this.error = error instanceof APIError ? error : new APIError(String(error), 0);
    }
    this.loaded = true;
    this._emit();
  }

  /** Usage and the queue trend (after job events). */
  async refreshActivity(): Promise<void> {
    const { span, step } = RANGES[this.range];
    try {
      const [byUser, byGroup, queue] = await Promise.all([
        api.usage(span, 'user'),
        api.usage(span, 'group'),
        api.queueHistory(span, step)
      ]);
      this.byUser = byUser;
      this.byGroup = byGroup;
      this.queue = queue;
      this._emit();
    } catch (error) {
      // the next full refresh says what is wrong
    }
  }

  async resolve(finding: IFinding): Promise<void> {
    await this._act(finding, async () => {
      const closed = await api.resolveFinding(finding.id);
      this._mergeFinding(closed);
    });
  }

  async drain(finding: IFinding, draining: boolean): Promise<void> {
    if (finding.gpu === null) {
      return;
    }
    await this._act(finding, async () => {
      const reason = draining
        ? `drained from the dashboard: ${finding.kind.replace(/_/g, ' ')}`
        : 'undrained from the dashboard';
      const answer = await api.drain(finding.host || 'localhost', finding.gpu as number, draining, reason);
      this.jobs.gpus = answer.gpus;
      this.jobs.refreshSoon(0);
      const { findings } = await api.findings(true);
      this.findings = sortFindings(findings);
    });
  }

  /** The GPU a finding is about, as the inventory shows it now. */
  gpuOf(finding: IFinding): IGPU | undefined {
    if (finding.gpu === null) {
      return undefined;
    }
    return this.jobs.gpus.find(
      g => g.index === finding.gpu && (!finding.host || g.host === finding.host)
    );
  }

  private async _act(finding: IFinding, action: () => Promise<void>): Promise<void> {
    this.busy.add(finding.id);
    this._emit();
    try {
      await action();
    } finally {
      this.busy.delete(finding.id);
      this._emit();
    }
  }

  private _onMessage(_: GPUJobsModel, message: SocketMessage): void {
    if (message.type === 'gpus') {
      this._appendReadings(message.gpus);
    } else if (message.type === 'finding') {
      this._mergeFinding(message.finding);
    } else if (message.type === 'job') {
      window.clearTimeout(this._soon);
      this._soon = window.setTimeout(() => void this.refreshActivity(), 1500);
    }
  }

  private _onJobsChanged(): void {
    // the queue's length now, as the panel knows it: the trend's live end
    if (this.queue && this.jobs.loaded && !this.jobs.error) {
      const last = this._queueNow;
      if (last !== this.jobs.queueTotal) {
        this._queueNow = this.jobs.queueTotal;
        this._emit();
      }
    }
  }

  /** The queue length points, with the current length at the end. */
  queuePoints(): { t: number; queue: number }[] {
    const points = (this.queue?.points ?? []).map(p => ({
      t: p.time * 1000,
      queue: p.queue_length
    }));
    if (this.queue && this.jobs.loaded) {
      points.push({ t: nowSeconds() * 1000, queue: this.jobs.queueTotal });
    }
    return points;
  }

  private _appendReadings(gpus: IGPU[]): void {
    if (!this.loaded || gpus.length === 0) {
      return;
    }
    const now = nowSeconds();
    const { span, step } = RANGES[this.range];
    const cutoff = (now - span) * 1000;
    const live = gpus.map(g => ({
      t: now * 1000,
      gpu: gpuLabel(g.host, g.index, gpus),
      util: g.utilization,
      util_max: g.utilization,
      mem: g.memory_used_mb / 1024,
      total: g.memory_total_mb / 1024
    }));
    this.gpuPoints = withGaps([...this.gpuPoints.filter(p => p.t >= cutoff), ...live], step);
    this._emit();
  }

  private _mergeFinding(finding: IFinding): void {
    const others = this.findings.filter(f => f.id !== finding.id);
    this.findings = sortFindings(finding.open ? [finding, ...others] : others);
    this._emit();
  }

  private _schedule(): void {
    window.clearInterval(this._timer);
    this._timer = window.setInterval(() => void this.refresh(), RANGES[this.range].every * 1000);
  }

  private _emit(): void {
    if (!this._disposed) {
      this._changed.emit();
    }
  }

  private _changed = new Signal<this, void>(this);
  private _disposed = false;
  private _timer = 0;
  private _soon = 0;
  private _queueNow = -1;
}

function gpuLabel(host: string, index: number, gpus: { host: string }[]): string {
  const hosts = new Set(gpus.map(g => g.host));
  return hosts.size > 1 ? `${host}:${index}` : `GPU ${index}`;
}

function bucketPoint(b: ISampleBucket, _: number, all: ISampleBucket[]): IGPUPoint {
  return {
    t: (b.time + b.step / 2) * 1000,
    gpu: gpuLabel(b.host, b.gpu, all),
    util: b.utilization,
    util_max: b.utilization_max,
    mem: b.memory_used_mb === null ? null : b.memory_used_mb / 1024,
    total: b.memory_total_mb === null ? null : b.memory_total_mb / 1024
  };
}

/**
 * The points with a gap point (null values) wherever a GPU has no reading for longer than
 * GAP_BUCKETS buckets of `step` seconds, so its lines break there; gap points already in
 * `points` are dropped first (appending live readings sees the breaks anew).
 */
export function withGaps(points: IGPUPoint[], step: number): IGPUPoint[] {
  const limit = Math.max(GAP_BUCKETS * step, GAP_MIN_S) * 1000;
  const byGpu = new Map<string, IGPUPoint[]>();
  for (const p of points) {
    if (!p.gap) {
      const series = byGpu.get(p.gpu);
      if (series) {
        series.push(p);
      } else {
        byGpu.set(p.gpu, [p]);
      }
    }
  }
  const out: IGPUPoint[] = [];
  for (const [gpu, series] of byGpu) {
    series.sort((a, b) => a.t - b.t);
    series.forEach((p, i) => {
      const prev = series[i - 1];
      if (prev && p.t - prev.t > limit) {
        out.push({ t: (prev.t + p.t) / 2, gpu, util: null, util_max: null, mem: null, total: null, gap: true });
      }
      out.push(p);
    });
  }
  return out;
}

const SEVERITY: { [s: string]: number } = { error: 0, warning: 1, info: 2 };

function sortFindings(findings: IFinding[]): IFinding[] {
  return [...findings]
    .filter(f => f.open)
    .sort((a, b) => (SEVERITY[a.severity] ?? 3) - (SEVERITY[b.severity] ?? 3) || b.last_seen - a.last_seen);
}

export const KIND_LABELS: { [kind: string]: string } = {
  oom: 'Out of memory',
  repeated_failure: 'Repeated failures',
  idle_hog: 'Idle GPU hog',
  gpu_errors: 'Failing GPU',
  gpu_drained: 'GPU drained',
  rogue_process: 'Rogue process',
  job_set_aside: 'Job set aside'
};

// ------------------------------------------------------------------ specs

/** Time formats on the browser locale's clock (24-hour or 12-hour, as the panel's text). */
const TIME = chartTimeFormats();

/** The time axis of the charts over the chosen range: from `x0` to `x1` (ms, set with the data). */
const TIME_X = {
  field: 't',
  type: 'temporal',
  title: null,
  scale: { domain: [{ expr: 'x0' }, { expr: 'x1' }] },
  axis: { grid: false, labelOverlap: true, tickCount: 6, format: TIME.axis, formatType: 'time' }
};

const WINDOW_PARAMS = [
  { name: 'x0', value: 0 },
  { name: 'x1', value: 1 }
];

const UTIL_SPEC: VisualizationSpec = {
  params: WINDOW_PARAMS,
  mark: { type: 'line', interpolate: 'monotone' },
  encoding: {
    x: TIME_X,
    y: {
      field: 'util',
      type: 'quantitative',
      title: 'utilization %',
      scale: { domain: [0, 100] },
      axis: { tickCount: 4 }
    },
    color: { field: 'gpu', type: 'nominal', title: null },
    tooltip: [
      { field: 'gpu', title: 'GPU' },
      { field: 't', type: 'temporal', title: 'time', format: TIME.second },
      { field: 'util', title: 'mean %', format: '.0f' },
      { field: 'util_max', title: 'peak %', format: '.0f' }
    ]
  }
} as any;

const MEM_SPEC: VisualizationSpec = {
  params: WINDOW_PARAMS,
  layer: [
    {
      mark: { type: 'line', interpolate: 'monotone' },
      encoding: {
        x: TIME_X,
        y: { field: 'mem', type: 'quantitative', title: 'memory used (GiB)', axis: { tickCount: 4 } },
        color: { field: 'gpu', type: 'nominal', title: null },
        tooltip: [
          { field: 'gpu', title: 'GPU' },
          { field: 't', type: 'temporal', title: 'time', format: TIME.second },
          { field: 'mem', title: 'GiB used', format: '.1f' },
          { field: 'total', title: 'GiB total', format: '.0f' }
        ]
      }
    },
    {
      // the size of the largest card: how full they are at a glance
      mark: { type: 'rule', strokeDash: [4, 4], opacity: 0.5 },
      encoding: { y: { aggregate: 'max', field: 'total', type: 'quantitative' } }
    }
  ]
} as any;

const HEATMAP_SPEC: VisualizationSpec = {
  mark: { type: 'rect', cornerRadius: 2 },
  encoding: {
    x: {
      field: 'hour',
      type: 'ordinal',
      title: 'hour of day',
      scale: { domain: Array.from({ length: 24 }, (_, i) => i) },
      axis: { labelAngle: 0, labelExpr: 'datum.value % 3 === 0 ? datum.value : ""' }
    },
    y: {
      field: 'day',
      type: 'ordinal',
      title: null,
      scale: { domain: ['Mon', 'Tue', 'Wed', 'Thu', 'Fri', 'Sat', 'Sun'] }
    },
    color: {
      field: 'util',
      type: 'quantitative',
      title: 'mean utilization %',
      scale: { domain: [0, 100], scheme: 'blues' },
      legend: { orient: 'bottom', direction: 'horizontal', gradientLength: 160 }
    },
    tooltip: [
      { field: 'day', title: 'day' },
      { field: 'hour', title: 'hour' },
      { field: 'util', title: 'mean %', format: '.0f' },
      { field: 'samples', title: 'readings' }
    ]
  },
  config: { scale: { bandPaddingInner: 0.08 } }
} as any;

function heatmapSpec(dark: boolean): VisualizationSpec {
  const spec = JSON.parse(JSON.stringify(HEATMAP_SPEC));
  // the low end a step off the card's background, so a quiet hour still shows
  spec.encoding.color.scale.scheme = dark ? { name: 'viridis', extent: [0.12, 1] } : { name: 'blues', extent: [0.15, 1] };
  return spec;
}

const HEATMAP_LIGHT = heatmapSpec(false);
const HEATMAP_DARK = heatmapSpec(true);

function barsSpec(title: string): VisualizationSpec {
  return {
    mark: { type: 'bar', cornerRadiusEnd: 3, height: { band: 0.7 } },
    encoding: {
      y: { field: 'key', type: 'nominal', title: null, sort: '-x', axis: { labelLimit: 110 } },
      x: { field: 'gpu_hours', type: 'quantitative', title, axis: { tickCount: 3, format: '~r' } },
      tooltip: [
        { field: 'key', title },
        { field: 'gpu_hours', title: 'GPU-hours', format: '.2f' },
        { field: 'jobs', title: 'jobs' }
      ]
    }
  } as any;
}

const USER_SPEC = barsSpec('GPU-hours');
const GROUP_SPEC = barsSpec('GPU-hours');

const QUEUE_SPEC: VisualizationSpec = {
  params: WINDOW_PARAMS,
  layer: [
    {
      mark: { type: 'area', interpolate: 'step-after', opacity: 0.25 },
      encoding: {
        x: TIME_X,
        y: { field: 'queue', type: 'quantitative', title: 'jobs waiting', axis: { tickMinStep: 1, tickCount: 4 } }
      }
    },
    {
      mark: { type: 'line', interpolate: 'step-after' },
      encoding: {
        x: TIME_X,
        y: { field: 'queue', type: 'quantitative' },
        tooltip: [
          { field: 't', type: 'temporal', title: 'time', format: TIME.minute },
          { field: 'queue', title: 'jobs waiting' }
        ]
      }
    }
  ]
} as any;

const WAIT_SPEC: VisualizationSpec = {
  params: WINDOW_PARAMS,
  transform: [{ fold: ['mean', 'p90'], as: ['stat', 'minutes'] }, { filter: 'datum.minutes !== null' }],
  mark: { type: 'line', point: { size: 30 } },
  encoding: {
    x: TIME_X,
    y: { field: 'minutes', type: 'quantitative', title: 'wait before start (min)', axis: { tickCount: 4 } },
    color: {
      field: 'stat',
      type: 'nominal',
      title: null,
      scale: { domain: ['mean', 'p90'] },
      legend: { labelExpr: 'datum.value === "p90" ? "90th percentile" : "mean"' }
    },
    tooltip: [
      { field: 't', type: 'temporal', title: 'started in the bucket of', format: TIME.minute },
      { field: 'stat', title: 'statistic' },
      { field: 'minutes', title: 'minutes', format: '.1f' },
      { field: 'started', title: 'jobs started' }
    ]
  }
} as any;

// ------------------------------------------------------------------ views

export interface IDashboardActions {
  openPanel(): void;
}

export class GPUDashboard extends ReactWidget {
  constructor(
    readonly model: DashboardModel,
    private readonly _actions: IDashboardActions,
    private readonly _theme: () => string
  ) {
    super();
    this.id = 'gpujobs-dashboard';
    this.addClass('jp-GPUDash');
    this.title.label = 'GPU Dashboard';
    this.title.caption = 'GPU use, the queue and the monitor’s findings, live';
    this.title.icon = chartIcon;
    this.title.closable = true;
  }

  /** The JupyterLab theme changed: draw the charts in its colours. */
  themeChanged(): void {
    // the new theme's CSS variables are in place once its style sheet is applied
    window.setTimeout(() => this.update(), 100);
  }

  protected render(): React.ReactElement {
    return (
      <UseSignal signal={this.model.changed}>
        {() => <DashboardView model={this.model} actions={this._actions} theme={this._theme()} />}
      </UseSignal>
    );
  }
}

function DashboardView(props: {
  model: DashboardModel;
  actions: IDashboardActions;
  theme: string;
}): React.ReactElement {
  const { model, theme } = props;
  const jobs = model.jobs;
  const dark = document.body.dataset.jpThemeLight === 'false';
  const range = RANGES[model.range];
  const heatValues = React.useMemo(() => heatmapValues(model.heatmap), [model.heatmap]);
  const userValues = React.useMemo(() => model.byUser?.rows ?? [], [model.byUser]);
  const groupValues = React.useMemo(() => model.byGroup?.rows ?? [], [model.byGroup]);
  const waitValues = React.useMemo(
    () =>
      (model.queue?.points ?? [])
        .filter(p => p.started > 0)
        .map(p => ({
          t: (p.time + (model.queue as IQueueHistory).step / 2) * 1000,
          mean: p.wait_mean_s === null ? null : p.wait_mean_s / 60,
          p90: p.wait_p90_s === null ? null : p.wait_p90_s / 60,
          started: p.started
        })),
    [model.queue]
  );
  const queueValues = model.queuePoints();
  const now = Date.now();
  const timeWindow = { x0: now - range.span * 1000, x1: now };
  const queueKey = queueValues.map(p => p.queue).join(',') + `@${model.queue?.until ?? 0}`;
  const stableQueue = React.useMemo(() => queueValues, [queueKey]);
  return (
    <div className="jp-GPUDash-body">
      <header className="jp-GPUDash-header">
        <h1 className="jp-GPUDash-title">GPU dashboard</h1>
        <div className="jp-GPUDash-ranges" role="group" aria-label="time range">
          {(Object.keys(RANGES) as Range[]).map(r => (
            <button
              key={r}
              className={`jp-GPUDash-range ${r === model.range ? 'jp-mod-active' : ''}`}
              data-range={r}
              aria-pressed={r === model.range}
              onClick={() => model.setRange(r)}
            >
              {RANGES[r].label}
            </button>
          ))}
        </div>
        <span className={`jp-GPUJobs-conn jp-mod-${jobs.connection}`}>
          <span className="jp-GPUJobs-connDot" />
          {jobs.connection === 'live' ? 'live' : jobs.connection}
        </span>
      </header>
      {model.error && (
        <div className="jp-GPUJobs-error" role="alert">
          <div className="jp-GPUJobs-errorTitle">The dashboard cannot read the monitor</div>
          <div className="jp-GPUJobs-errorText">{model.error.message}</div>
          <button className="jp-GPUJobs-button jp-mod-accept" onClick={() => void model.refresh()}>
            Retry
          </button>
        </div>
      )}
      <Tiles model={model} />
      <div className="jp-GPUDash-grid">
        <Card name="utilization" title="GPU utilization" note={range.label.toLowerCase()} size="half">
          <VegaChart
            name="utilization"
            signals={timeWindow}
            spec={UTIL_SPEC}
            values={model.gpuPoints}
            summary={latestUtil(model.gpuPoints)}
            height={170}
            theme={theme}
            empty={model.loaded ? 'No GPU readings in this range yet.' : 'Loading…'}
          />
        </Card>
        <Card name="memory" title="GPU memory" note={range.label.toLowerCase()} size="half">
          <VegaChart
            name="memory"
            signals={timeWindow}
            spec={MEM_SPEC}
            values={model.gpuPoints}
            height={170}
            theme={theme}
            empty={model.loaded ? 'No GPU readings in this range yet.' : 'Loading…'}
          />
        </Card>
        <Card
          name="heatmap"
          title="Busy hours"
          note={`mean utilization, last 7 days (${model.heatmap?.timezone ?? 'local time'})`}
          size="twothirds"
        >
          <VegaChart
            name="heatmap"
            spec={dark ? HEATMAP_DARK : HEATMAP_LIGHT}
            values={heatValues}
            height={150}
            theme={theme}
            empty={model.loaded ? 'No GPU readings in the last 7 days.' : 'Loading…'}
          />
        </Card>
        <Card name="users" title="GPU-hours per user" note={range.label.toLowerCase()}>
          <VegaChart
            name="users"
            spec={USER_SPEC}
            values={userValues}
            summary={userValues.map(r => `${r.key}=${r.gpu_hours}`).join(',')}
            height={Math.max(60, userValues.length * 22)}
            theme={theme}
            empty={model.loaded ? 'No GPU was allocated in this range.' : 'Loading…'}
          />
        </Card>
        <Card name="groups" title="GPU-hours per group" note={range.label.toLowerCase()}>
          <VegaChart
            name="groups"
            spec={GROUP_SPEC}
            values={groupValues}
            summary={groupValues.map(r => `${r.key}=${r.gpu_hours}`).join(',')}
            height={Math.max(60, groupValues.length * 22)}
            theme={theme}
            empty={model.loaded ? 'No GPU was allocated in this range.' : 'Loading…'}
          />
        </Card>
        <Card name="queue" title="Queue length" note={range.label.toLowerCase()}>
          <VegaChart
            name="queue"
            signals={timeWindow}
            spec={QUEUE_SPEC}
            values={stableQueue}
            last={stableQueue.length ? String(stableQueue[stableQueue.length - 1].queue) : undefined}
            height={130}
            theme={theme}
            empty={model.loaded ? 'No queue history yet.' : 'Loading…'}
          />
        </Card>
        <Card name="wait" title="Wait before start" note={`jobs that started, ${range.label.toLowerCase()}`}>
          <VegaChart
            name="wait"
            signals={timeWindow}
            spec={WAIT_SPEC}
            values={waitValues}
            height={130}
            theme={theme}
            empty={model.loaded ? 'No job started in this range.' : 'Loading…'}
          />
        </Card>
        {jobs.reservations.length > 0 && (
          <Card name="reservations" title="Reservations" note="GPUs kept for some users or groups" size="wide">
            <Reservations reservations={jobs.reservations} now={nowSeconds()} me={jobs.user} />
          </Card>
        )}
        <Card
          name="findings"
          title="Open findings"
          note={model.jobs.admin ? 'all users' : 'about you and your jobs'}
          size="wide"
        >
          <Findings model={model} />
        </Card>
      </div>
    </div>
  );
}

/**
 * A card of the grid. `size`: how much of a wide dashboard it takes (a third by default); at
 * medium widths "half" and "twothirds" take a row of their own, others half of one.
 */
function Card(props: {
  title: string;
  note?: string;
  size?: 'half' | 'twothirds' | 'wide';
  name: string;
  children: React.ReactNode;
}): React.ReactElement {
  return (
    <section
      className={`jp-GPUDash-card ${props.size ? `jp-mod-${props.size}` : ''}`}
      data-card={props.name}
    >
      <h2 className="jp-GPUDash-cardTitle">
        {props.title}
        {props.note && <span className="jp-GPUDash-cardNote">{props.note}</span>}
      </h2>
      {props.children}
    </section>
  );
}

function Tiles(props: { model: DashboardModel }): React.ReactElement {
  const jobs = props.model.jobs;
  const gpus = jobs.gpus;
  const busy = gpus.filter(g => g.job_id !== null).length;
  const util = gpus.length ? gpus.reduce((s, g) => s + (g.utilization || 0), 0) / gpus.length : 0;
  const used = gpus.reduce((s, g) => s + g.memory_used_mb, 0);
  const reserved = gpus.reduce((s, g) => s + (g.memory_reserved_mb ?? 0), 0);
  const total = gpus.reduce((s, g) => s + g.memory_total_mb, 0);
  const draining = gpus.filter(g => g.draining || g.healthy === false).length;
  const findings = props.model.findings;
  const errors = findings.filter(f => f.severity === 'error').length;
  return (
    <div className="jp-GPUDash-tiles">
      <Tile name="busy" label="GPUs in use" value={`${busy} of ${gpus.length}`} fraction={gpus.length ? busy / gpus.length : 0}
        note={draining ? `${draining} draining or unhealthy` : 'all healthy'} />
      <Tile name="util" label="Utilization now" value={`${Math.round(util)}%`} fraction={util / 100} note="mean of all GPUs" />
      <Tile name="memory" label="Memory in use" value={`${formatGiB(used)} of ${formatGiB(total)} GiB`}
        fraction={total ? used / total : 0}
        note={`${gpus.length} GPU${gpus.length === 1 ? '' : 's'}` +
          (reserved ? `; ${formatGiB(reserved)} GiB reserved by the driver, not counted` : '')} />
      <Tile name="queue" label="Waiting" value={`${jobs.queueTotal} job${jobs.queueTotal === 1 ? '' : 's'}`}
        note={(jobs.queueTotal ? `first starts ${startText(jobs)}` : 'nobody is waiting') +
          (jobs.queueHeld ? `; ${jobs.queueHeld} held` : '')} />
      <Tile name="findings" label="Open findings" value={String(findings.length)}
        note={errors ? `${errors} need${errors === 1 ? 's' : ''} attention` : findings.length ? 'warnings' : 'all quiet'}
        level={errors ? 'error' : findings.length ? 'warn' : 'ok'} />
      {(jobs.quota?.budgets ?? []).map(b => (
        <Tile key={`${b.scope}:${b.name}`} name="budget" label={`GPU-hours of ${b.scope === 'users' ? 'user' : 'group'} ${b.name}`}
          value={`${b.left_gpu_hours.toFixed(1)} of ${b.gpu_hours} left`} fraction={b.used_gpu_hours / b.gpu_hours}
          note={b.used_up ? (b.mode === 'low' ? 'used up: jobs run at low priority' : 'used up: jobs wait') :
            `${b.percent}% used this ${b.period === 'dates' ? 'term' : b.period}`}
          level={b.used_up ? 'error' : b.percent >= 80 ? 'warn' : 'ok'} />
      ))}
    </div>
  );
}

function startText(jobs: GPUJobsModel): string {
  const first = jobs.queue[0];
  if (!first || first.expected_start === null) {
    return 'at an unknown time';
  }
  const delta = first.expected_start - nowSeconds();
  return delta <= 1 ? 'now' : `in ${formatDuration(delta)}`;
}

function Tile(props: {
  name: string;
  label: string;
  value: string;
  note: string;
  fraction?: number;
  level?: 'ok' | 'warn' | 'error';
}): React.ReactElement {
  return (
    <div
      className={`jp-GPUDash-tile jp-mod-${props.level ?? 'plain'}`}
      data-tile={props.name}
      title={`${props.label}: ${props.value} (${props.note})`}
    >
      <div className="jp-GPUDash-tileLabel">{props.label}</div>
      <div className="jp-GPUDash-tileValue">{props.value}</div>
      {props.fraction !== undefined && (
        <div className="jp-GPUJobs-bar jp-GPUDash-tileBar">
          <div
            className={`jp-GPUJobs-barFill ${props.fraction >= 0.9 ? 'jp-mod-mid' : 'jp-mod-low'}`}
            style={{ width: `${(Math.min(1, Math.max(0, props.fraction)) * 100).toFixed(1)}%` }}
          />
        </div>
      )}
      <div className="jp-GPUDash-tileNote">{props.note}</div>
    </div>
  );
}

function Findings(props: { model: DashboardModel }): React.ReactElement {
  const { model } = props;
  const admin = model.jobs.admin;
  if (model.findings.length === 0) {
    return (
      <div className="jp-GPUDash-none" data-findings="0">
        No open findings: no out-of-memory jobs, repeated failures, idle hogs, rogue processes or failing GPUs.
      </div>
    );
  }
  return (
    <ul className="jp-GPUDash-findings" data-findings={model.findings.length}>
      {model.findings.map(f => {
        const gpu = model.gpuOf(f);
        const busy = model.busy.has(f.id);
        return (
          <li key={f.id} className={`jp-GPUDash-finding jp-mod-${f.severity}`} data-finding-id={f.id} data-kind={f.kind}>
            <div className="jp-GPUDash-findingHead">
              <span className={`jp-GPUDash-severity jp-mod-${f.severity}`}>{KIND_LABELS[f.kind] ?? f.kind}</span>
              <span className="jp-GPUDash-findingWhere">
                {[
                  f.job_id !== null ? `job #${f.job_id}` : null,
                  f.user,
                  f.gpu !== null ? `GPU ${f.gpu}${f.host ? ` on ${f.host}` : ''}` : null
                ]
                  .filter(Boolean)
                  .join(' · ')}
              </span>
              <span className="jp-GPUDash-findingTime" title={new Date(f.time * 1000).toLocaleString()}>
                {formatAgo(f.time, nowSeconds())}
              </span>
            </div>
            <div className="jp-GPUDash-findingText">{f.message}</div>
            {admin && (
              <div className="jp-GPUJobs-actions">
                {gpu && !gpu.draining && (
                  <button className="jp-GPUJobs-button jp-mod-warn" data-action="drain" disabled={busy}
                    title={`Start no new job on GPU ${gpu.index}; the running one keeps it`}
                    onClick={() => void model.drain(f, true)}>
                    Drain GPU {gpu.index}
                  </button>
                )}
                {gpu && gpu.draining && (
                  <button className="jp-GPUJobs-button" data-action="undrain" disabled={busy}
                    title={`Let the queue use GPU ${gpu.index} again`}
                    onClick={() => void model.drain(f, false)}>
                    Undrain GPU {gpu.index}
                  </button>
                )}
                {f.kind !== 'gpu_drained' && (
                  <button className="jp-GPUJobs-button" data-action="resolve" disabled={busy}
                    title="Close this finding: it is dealt with"
                    onClick={() => void model.resolve(f)}>
                    Resolve
                  </button>
                )}
              </div>
            )}
          </li>
        );
      })}
    </ul>
  );
}

/** "GPU 0=57,GPU 1=0": the latest utilization of each GPU. */
function latestUtil(points: IGPUPoint[]): string {
  const latest = new Map<string, number | null>();
  for (const p of points) {
    latest.set(p.gpu, p.util);
  }
  return [...latest].map(([gpu, util]) => `${gpu}=${util === null ? '' : Math.round(util)}`).join(',');
}

function heatmapValues(heatmap: IHeatmap | null): any[] {
  if (!heatmap) {
    return [];
  }
  const out: any[] = [];
  heatmap.weekdays.forEach((day, d) => {
    heatmap.hours.forEach((hour, h) => {
      const util = heatmap.utilization[d][h];
      if (util !== null) {
        out.push({ day, hour, util, samples: heatmap.samples[d][h] });
      }
    });
  });
  return out;
}
