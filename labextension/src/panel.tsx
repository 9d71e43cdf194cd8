/**
 * The "GPU Jobs" sidebar: GPUs (gauges and memory bars), my jobs, the queue and my quota.
 * A view of GPUJobsModel; it renders on the model's `changed` signal and once a second
 * for the clocks (elapsed time, expected start).
 */
import * as React from 'react';
import { ReactWidget, UseSignal } from '@jupyterlab/ui-components';
import { FINAL_STATES, IGPU, IGPUHolder, IJob, IQuota, IReservation, api } from './api';
import {
  endReason,
  formatAgo,
  formatClock,
  formatDuration,
  formatGiB,
  formatStart,
  formatStartShort,
  gpuRequest,
  jobLabel,
  nowSeconds,
  stateLabel
} from './format';
import { chartIcon, gpuIcon } from './icons';
import { GPUJobsModel } from './model';
import { describeNotifications, editNotifications } from './notify';

export interface IPanelActions {
  cancel(job: IJob): void;
  /** Hold a pending job (`hold` true) or release a held one. */
  hold(job: IJob, hold: boolean): void;
  openLog(job: IJob): void;
  openOutput(job: IJob): void;
  openDashboard(): void;
  retry(): void;
}

export class GPUJobsPanel extends ReactWidget {
  constructor(
    readonly model: GPUJobsModel,
    private readonly _actions: IPanelActions
  ) {
    super();
    this.id = 'gpujobs-panel';
    this.addClass('jp-GPUJobs');
    this.title.icon = gpuIcon;
    this.title.caption = 'GPU Jobs';
  }

  protected render(): React.ReactElement {
    return (
      <UseSignal signal={this.model.changed}>
        {() => <PanelView model={this.model} actions={this._actions} />}
      </UseSignal>
    );
  }
}

function useClock(): number {
  const [now, setNow] = React.useState(nowSeconds());
  React.useEffect(() => {
    const timer = window.setInterval(() => setNow(nowSeconds()), 1000);
    return () => window.clearInterval(timer);
  }, []);
  return now;
}

function PanelView(props: {
  model: GPUJobsModel;
  actions: IPanelActions;
}): React.ReactElement {
  const { model, actions } = props;
  const now = useClock();
  const error = model.error;
  const active = model.myJobs.filter(j => !FINAL_STATES.has(j.state));
  const finished = model.myJobs.filter(j => FINAL_STATES.has(j.state));
  return (
    <div className="jp-GPUJobs-body">
      <header className="jp-GPUJobs-header">
        <h2 className="jp-GPUJobs-title">GPU Jobs</h2>
        <Connection model={model} />
        <button
          className="jp-GPUJobs-dashButton"
          data-action="dashboard"
          title="Open the GPU dashboard: use over time, the queue, findings"
          onClick={() => actions.openDashboard()}
        >
          <chartIcon.react tag="span" className="jp-GPUJobs-dashIcon" />
          Dashboard
        </button>
      </header>
      {!model.loaded && (
        <div className="jp-GPUJobs-loading" role="status">
          Loading the GPU queue…
        </div>
      )}
      {error && (
        <div className="jp-GPUJobs-error" role="alert">
          <div className="jp-GPUJobs-errorTitle">
            {error.unreachable
              ? 'The GPU job engine is unreachable'
              : 'The GPU job engine answered with an error'}
          </div>
          <div className="jp-GPUJobs-errorText">{withCode(error.message)}</div>
          <button
            className="jp-GPUJobs-button jp-mod-accept"
            onClick={() => actions.retry()}
          >
            Retry
          </button>
        </div>
      )}
      {model.loaded && !(error && error.unreachable && !model.user) && (
        <>
          <Section title="GPUs" name="gpus" count={model.gpus.length}>
            <GPUList gpus={model.gpus} backend={model.backend} me={model.user} />
            {model.isolation && (
              <div
                className="jp-GPUJobs-hint jp-GPUJobs-isolation"
                title="What keeps each job to its own GPUs and processes on this server"
              >
                {model.isolation}
              </div>
            )}
          </Section>
          <Section title="My jobs" name="myjobs" count={active.length}>
            <MyJobs jobs={active} finished={finished.length} now={now} actions={actions} />
          </Section>
          <Section title="Queue" name="queue" count={model.queueTotal}>
            <Queue jobs={model.queue} total={model.queueTotal} now={now} me={model.user} />
          </Section>
          {finished.length > 0 && (
            <Section title="My finished jobs" name="finished" count={finished.length}>
              <FinishedJobs jobs={finished} now={now} actions={actions} />
            </Section>
          )}
          {model.reservations.length > 0 && (
            <Section title="Reservations" name="reservations" count={model.reservations.length}>
              <Reservations reservations={model.reservations} now={now} me={model.user} />
            </Section>
          )}
          <Section title="My quota" name="quota">
            <Quota quota={model.quota} gpusOnServer={model.gpus.length} />
          </Section>
          {model.notifications && (
            <Section title="Notifications" name="notifications">
              <NotificationSettings model={model} />
            </Section>
          )}
        </>
      )}
    </div>
  );
}

/** Text with `backtick` spans shown as code (commands to run). */
function withCode(text: string): React.ReactNode[] {
  return text
    .split('`')
    .map((part, i) => (i % 2 === 1 ? <code key={i}>{part}</code> : part));
}

function Connection(props: { model: GPUJobsModel }): React.ReactElement {
  const c = props.model.connection;
  const label =
    c === 'live' ? 'live' : c === 'connecting' ? 'connecting' : 'reconnecting';
  const title =
    c === 'live'
      ? 'Updates arrive live over the websocket'
      : 'The live feed is down: reconnecting; the panel still refreshes every few seconds';
  return (
    <span className={`jp-GPUJobs-conn jp-mod-${c}`} title={title}>
      <span className="jp-GPUJobs-connDot" />
      {label}
      {props.model.user && (
        <span className="jp-GPUJobs-user"> · {props.model.user}</span>
      )}
    </span>
  );
}

function Section(props: {
  title: string;
  name: string;
  count?: number;
  children: React.ReactNode;
}): React.ReactElement {
  return (
    <section className={`jp-GPUJobs-section jp-GPUJobs-section-${props.name}`}>
      <h3 className="jp-GPUJobs-sectionTitle">
        {props.title}
        {props.count !== undefined && props.count > 0 && (
          <span className="jp-GPUJobs-count">{props.count}</span>
        )}
      </h3>
      {props.children}
    </section>
  );
}

// ------------------------------------------------------------------- GPUs

function GPUList(props: {
  gpus: IGPU[];
  backend: string;
  me: string | null;
}): React.ReactElement {
  if (props.gpus.length === 0) {
    return (
      <div className="jp-GPUJobs-empty">
        <div className="jp-GPUJobs-emptyTitle">No GPUs on this server</div>
        <div className="jp-GPUJobs-hint">
          {props.backend === 'none' || !props.backend
            ? 'NVML found no NVIDIA GPU. Jobs asking for GPUs will wait; jobs with 0 GPUs run. ' +
              'For a demo, start JupyterLab with GPUJOBS_FAKE_GPUS=2xA100.'
            : 'The GPU backend reports no GPUs.'}
        </div>
      </div>
    );
  }
  const hosts = new Set(props.gpus.map(g => g.host));
  return (
    <div className="jp-GPUJobs-gpus">
      {props.gpus.map(g => (
        <GPUCard
          key={`${g.host}:${g.index}`}
          gpu={g}
          showHost={hosts.size > 1}
          mine={!!props.me && (g.user === props.me || (g.holders ?? []).some(h => h.user === props.me))}
          me={props.me}
        />
      ))}
    </div>
  );
}

/** How close a job is to its time limit: calm, getting there, about to be stopped. */
function level(fraction: number): string {
  return fraction >= 0.95 ? 'high' : fraction >= 0.8 ? 'mid' : 'low';
}

function GPUCard(props: {
  gpu: IGPU;
  showHost: boolean;
  mine: boolean;
  me: string | null;
}): React.ReactElement {
  const g = props.gpu;
  const holders = g.holders ?? [];
  const shared = holders.some(h => h.share !== null && h.share !== undefined);
  const util = Math.max(0, Math.min(100, g.utilization || 0));
  const memFraction = g.memory_total_mb ? g.memory_used_mb / g.memory_total_mb : 0;
  const reserved = g.memory_reserved_mb ?? 0;
  const foreign = g.job_id === null && g.foreign && !g.foreign_override ? g.foreign : null;
  const unhealthy = g.healthy === false;
  const classes = ['jp-GPUJobs-gpu'];
  if (g.job_id !== null) {
    classes.push('jp-mod-busy');
  }
  if (props.mine) {
    classes.push('jp-mod-mine');
  }
  if (unhealthy) {
    classes.push('jp-mod-unhealthy');
  }
  return (
    <div className={classes.join(' ')} data-gpu-index={g.index} data-gpu-host={g.host}>
      <Gauge value={util} />
      <div className="jp-GPUJobs-gpuInfo">
        <div className="jp-GPUJobs-gpuName" title={g.uuid}>
          <span className="jp-GPUJobs-gpuIndex">GPU {g.index}</span>
          <span className="jp-GPUJobs-gpuModel">{g.name}</span>
          {props.showHost && <span className="jp-GPUJobs-gpuHost">{g.host}</span>}
        </div>
        <div
          className="jp-GPUJobs-bar jp-GPUJobs-memBar"
          title={
            `memory: ${g.memory_used_mb} of ${g.memory_total_mb} MiB used by processes` +
            (reserved ? `; ${reserved} MiB reserved by the driver` : '')
          }
        >
          <div
            className={`jp-GPUJobs-barFill ${memFraction >= 0.9 ? 'jp-mod-mid' : ''}`}
            style={{ width: `${(memFraction * 100).toFixed(1)}%` }}
          />
        </div>
        <div className="jp-GPUJobs-gpuMem">
          {formatGiB(g.memory_used_mb)} / {formatGiB(g.memory_total_mb)} GiB
          {reserved > 0 && (
            <span className="jp-GPUJobs-gpuReserved" title="kept by the driver for itself, not used by any process">
              {' '}
              · {formatGiB(reserved)} GiB reserved
            </span>
          )}
        </div>
        <div className="jp-GPUJobs-holder">
          {unhealthy ? (
            <span className="jp-GPUJobs-tag jp-mod-error">unhealthy</span>
          ) : g.draining ? (
            <span className="jp-GPUJobs-tag jp-mod-warn">draining</span>
          ) : null}
          {shared ? (
            <span className="jp-GPUJobs-tag jp-mod-shared" title="Several jobs share this GPU, each with its part of it">
              shared
            </span>
          ) : g.job_id !== null ? (
            <span className="jp-GPUJobs-holderJob" title={`held by job #${g.job_id} of ${g.user}`}>
              job #{g.job_id} · {props.mine ? 'you' : g.user}
            </span>
          ) : foreign ? (
            <span className="jp-GPUJobs-tag jp-mod-warn" title={foreign}>
              outside the queue
            </span>
          ) : (
            <span className="jp-GPUJobs-tag jp-mod-free">free</span>
          )}
        </div>
        {foreign && (
          <div className="jp-GPUJobs-foreign" title={g.foreign_todo ?? ''}>
            {foreign}
            {g.foreign_todo && <div className="jp-GPUJobs-foreignTodo">→ {g.foreign_todo}</div>}
          </div>
        )}
        {shared && <Shares gpu={g} me={props.me} />}
      </div>
    </div>
  );
}

/** The jobs sharing a GPU, each with its part of the card and of its memory. */
function Shares(props: { gpu: IGPU; me: string | null }): React.ReactElement {
  const holders = props.gpu.holders ?? [];
  return (
    <div className="jp-GPUJobs-shares">
      <div className="jp-GPUJobs-shareBar" title="the card's parts held by jobs">
        {holders.map((h, i) => (
          <div
            key={h.job_id}
            className={`jp-GPUJobs-sharePart jp-mod-part${i % 4} ${h.user === props.me ? 'jp-mod-mine' : ''}`}
            style={{ width: `${((h.share ?? 1) * 100).toFixed(1)}%` }}
          />
        ))}
      </div>
      <ul className="jp-GPUJobs-shareList">
        {holders.map((h, i) => (
          <li key={h.job_id} data-job-id={h.job_id}>
            <span className={`jp-GPUJobs-shareDot jp-mod-part${i % 4}`} />
            <span title={`job #${h.job_id} of ${h.user}: ${shareText(h)}`}>
              #{h.job_id} · {h.user === props.me ? 'you' : h.user} · {shareText(h)}
            </span>
          </li>
        ))}
      </ul>
    </div>
  );
}

function shareText(h: IGPUHolder): string {
  const part = h.share === null ? 'whole card' : `${Math.round(h.share * 100)}%`;
  const used = h.used_mb !== null && h.used_mb !== undefined ? `${formatGiB(h.used_mb)} of ` : '';
  return `${part} · ${used}${formatGiB(h.memory_mb)} GiB`;
}

const R = 19;
const C = 2 * Math.PI * R;
const ARC = 0.75 * C;

/** A 270° arc gauge for a percentage. */
export function Gauge(props: { value: number }): React.ReactElement {
  const v = Math.max(0, Math.min(100, props.value));
  return (
    <svg
      className="jp-GPUJobs-gauge"
      viewBox="0 0 48 48"
      width="52"
      height="52"
      role="img"
      aria-label={`utilization ${Math.round(v)}%`}
    >
      <circle
        className="jp-GPUJobs-gaugeTrack"
        cx="24"
        cy="24"
        r={R}
        strokeDasharray={`${ARC} ${C}`}
        transform="rotate(135 24 24)"
      />
      {v > 0.5 && <circle
        className="jp-GPUJobs-gaugeValue"
        cx="24"
        cy="24"
        r={R}
        strokeDasharray={`${(ARC * v) / 100} ${C}`}
        transform="rotate(135 24 24)"
      />}
      <text className="jp-GPUJobs-gaugeText" x="24" y="27" textAnchor="middle">
        {Math.round(v)}%
      </text>
      <text className="jp-GPUJobs-gaugeLabel" x="24" y="43" textAnchor="middle">
        util
      </text>
    </svg>
  );
}

// ---------------------------------------------------------------- my jobs

function MyJobs(props: {
  jobs: IJob[];
  finished: number;
  now: number;
  actions: IPanelActions;
}): React.ReactElement {
  if (props.jobs.length === 0) {
    return (
      <div className="jp-GPUJobs-empty">
        <div className="jp-GPUJobs-emptyTitle">
          {props.finished ? 'Nothing of yours is pending or running' : 'You have no jobs'}
        </div>
        <div className="jp-GPUJobs-hint">
          Right-click a notebook and choose “Run on GPU queue…”, use the{' '}
          <code>%%gpujob</code> cell magic, or <code>jupyter gpujobs submit</code> in a
          terminal.
        </div>
      </div>
    );
  }
  return (
    <ul className="jp-GPUJobs-jobs">
      {props.jobs.map(job => (
        <JobRow key={job.id} job={job} now={props.now} actions={props.actions} />
      ))}
    </ul>
  );
}

const RECENT_FINISHED = 5;

/** My most recent finished jobs (the rest behind a toggle), after the queue. */
function FinishedJobs(props: {
  jobs: IJob[];
  now: number;
  actions: IPanelActions;
}): React.ReactElement {
  const [all, setAll] = React.useState(false);
  const shown = all ? props.jobs : props.jobs.slice(0, RECENT_FINISHED);
  const hidden = props.jobs.length - shown.length;
  return (
    <>
      <ul className="jp-GPUJobs-jobs">
        {shown.map(job => (
          <JobRow key={job.id} job={job} now={props.now} actions={props.actions} />
        ))}
      </ul>
      {(hidden > 0 || all) && props.jobs.length > RECENT_FINISHED && (
        <button className="jp-GPUJobs-more" onClick={() => setAll(!all)}>
          {all ? 'Show fewer finished jobs' : `Show ${hidden} older finished job${hidden === 1 ? '' : 's'}`}
        </button>
      )}
    </>
  );
}

function JobRow(props: {
  job: IJob;
  now: number;
  actions: IPanelActions;
}): React.ReactElement {
  const { job, now, actions } = props;
  const final = FINAL_STATES.has(job.state);
  // right-sizing advice from the user's earlier runs of this name, fetched when asked
  const [advice, setAdvice] = React.useState<string | null>(null);
  const askAdvice = async (): Promise<void> => {
    if (advice !== null) {
      setAdvice(null);
      return;
    }
    setAdvice('…');
    try {
      const a = (await api.job(job.id, true)).advice;
      setAdvice(a ? a.text : 'no earlier finished runs of this name to learn from');
    } catch (e) {
      setAdvice(e instanceof Error ? e.message : String(e));
    }
  };
  return (
    <li
      className={`jp-GPUJobs-job jp-mod-${job.state.toLowerCase()}`}
      data-job-id={job.id}
      data-state={job.state}
    >
      <div className="jp-GPUJobs-jobHead">
        <span className={`jp-GPUJobs-state jp-mod-${job.state.toLowerCase()}`}>
          {stateLabel(job.state)}
        </span>
        <span className="jp-GPUJobs-jobName" title={`${jobLabel(job)}: ${commandText(job)}`}>
          {jobLabel(job)}
        </span>
        <span className="jp-GPUJobs-jobId">#{job.id}</span>
      </div>
      <div className="jp-GPUJobs-jobMeta">
        {gpuRequest(job)} · {job.kind}
        {job.priority && job.priority !== 'normal' ? ` · ${job.priority}` : ''}
      </div>
      {job.state === 'RUNNING' && <Elapsed job={job} now={now} />}
      {(job.state === 'PENDING' || job.state === 'HELD') && (
        <div className="jp-GPUJobs-jobDetail">
          <span className="jp-GPUJobs-expected">
            {job.position ? `#${job.position} in queue · ` : ''}
            {job.state === 'HELD'
              ? 'starts once released'
              : `starts ${formatStart(job.expected_start, now, job.expected_start_kind, job.expected_start_range)}`}
          </span>
          {job.reason && <div className="jp-GPUJobs-reason">{job.reason}</div>}
          {job.expected_start_note && (
            <div className="jp-GPUJobs-reason">expected start {job.expected_start_note}</div>
          )}
        </div>
      )}
      {final && (
        <div className="jp-GPUJobs-jobDetail">
          <span className="jp-GPUJobs-reason">
            {job.state === 'COMPLETED' && job.exit_code === 0
              ? 'done'
              : endReason(job) || stateLabel(job.state)}
            {job.ended_at ? ` · ${formatAgo(job.ended_at, now)}` : ''}
            {job.started_at && job.ended_at
              ? ` · ran ${formatDuration(job.ended_at - job.started_at)}`
              : ''}
          </span>
        </div>
      )}
      {advice !== null && (
        <div className="jp-GPUJobs-jobDetail jp-GPUJobs-advice">{advice}</div>
      )}
      {!!job.retries && (
        <div className="jp-GPUJobs-jobDetail jp-GPUJobs-retries">
          run {(job.retried || 0) + 1} of {job.retries + 1} (retries after a failure)
        </div>
      )}
      <div className="jp-GPUJobs-actions">
        {(job.state === 'PENDING' || job.state === 'HELD') && (
          <button
            className="jp-GPUJobs-button"
            data-action={job.state === 'HELD' ? 'release' : 'hold'}
            title={
              job.state === 'HELD'
                ? `Release job ${job.id}: it may start again`
                : `Hold job ${job.id}: it does not start until released`
            }
            onClick={() => actions.hold(job, job.state !== 'HELD')}
          >
            {job.state === 'HELD' ? 'Release' : 'Hold'}
          </button>
        )}
        {!final && (
          <button
            className="jp-GPUJobs-button jp-mod-warn"
            data-action="cancel"
            title={`Cancel job ${job.id}`}
            onClick={() => actions.cancel(job)}
          >
            Cancel
          </button>
        )}
        {job.kind !== 'kernel' && ((job.state !== 'PENDING' && job.state !== 'HELD') || job.started_at) && (
          <button
            className="jp-GPUJobs-button"
            data-action="log"
            title={`Open the log of job ${job.id}`}
            onClick={() => actions.openLog(job)}
          >
            Log
          </button>
        )}
        {job.name && (
          <button
            className="jp-GPUJobs-button"
            data-action="advice"
            title={`What your earlier runs named ${job.name} really used, and a smaller request that would have held them`}
            onClick={() => void askAdvice()}
          >
            {advice === null ? 'Advice' : 'Hide advice'}
          </button>
        )}
        {job.kind === 'notebook' && job.output_notebook && job.state !== 'PENDING' && (
          <button
            className="jp-GPUJobs-button"
            data-action="output"
            title={job.output_notebook}
            onClick={() => actions.openOutput(job)}
          >
            Output notebook
          </button>
        )}
      </div>
    </li>
  );
}

function commandText(job: IJob): string {
  if (job.kind === 'notebook' && job.payload && job.payload.notebook) {
    return String(job.payload.notebook);
  }
  if (Array.isArray(job.command)) {
    return job.command.join(' ');
  }
  return job.command ? String(job.command) : '';
}

function Elapsed(props: { job: IJob; now: number }): React.ReactElement {
  const { job, now } = props;
  const elapsed = job.started_at ? Math.max(0, now - job.started_at) : 0;
  const limit = job.time_limit_s || 0;
  const fraction = limit ? Math.min(1, elapsed / limit) : 0;
  // past the engine's warning time: say when the job will be stopped
  const warned = !!job.warn_at && !!job.ends_at && now >= job.warn_at;
  return (
    <div className="jp-GPUJobs-jobDetail">
      <div
        className="jp-GPUJobs-bar jp-GPUJobs-timeBar"
        title={`${formatDuration(elapsed)} of the ${formatDuration(limit)} time limit`}
      >
        <div
          className={`jp-GPUJobs-barFill jp-mod-${level(fraction)}`}
          style={{ width: `${(fraction * 100).toFixed(1)}%` }}
        />
      </div>
      <div className="jp-GPUJobs-elapsed">
        <span>
          {formatDuration(elapsed)} / {limit ? formatDuration(limit) : 'no limit'}
          {warned ? (
            <span className="jp-GPUJobs-stopsIn">
              {' '}
              · stops in {formatDuration(Math.max(0, (job.ends_at as number) - now))}
            </span>
          ) : null}
        </span>
        <span className="jp-GPUJobs-where">
          {job.assigned_gpus.length
            ? `GPU ${job.assigned_gpus.join(', ')}${job.host ? ` on ${job.host}` : ''}`
            : ''}
          {job.borrowed ? ' · borrowed' : ''}
        </span>
      </div>
    </div>
  );
}

// ------------------------------------------------------------------ queue

function Queue(props: {
  jobs: IJob[];
  total: number;
  now: number;
  me: string | null;
}): React.ReactElement {
  if (props.jobs.length === 0) {
    return (
      <div className="jp-GPUJobs-empty">
        <div className="jp-GPUJobs-hint">Nobody is waiting: the queue is empty.</div>
      </div>
    );
  }
  return (
    <table className="jp-GPUJobs-queue">
      <thead>
        <tr>
          <th title="Place in the queue">#</th>
          <th>Job</th>
          <th className="jp-GPUJobs-starts" title="Expected start">Starts</th>
        </tr>
      </thead>
      <tbody>
        {props.jobs.map(job => (
          <tr
            key={job.id}
            data-job-id={job.id}
            className={job.user === props.me ? 'jp-mod-mine' : ''}
          >
            <td className="jp-GPUJobs-pos">{job.position ?? '—'}</td>
            <td className="jp-GPUJobs-qJob">
              <div className="jp-GPUJobs-qHead">
                <span className="jp-GPUJobs-qId">#{job.id}</span>
                <span className="jp-GPUJobs-qName" title={jobLabel(job)}>
                  {jobLabel(job)}
                </span>
              </div>
              <div className="jp-GPUJobs-qMeta">
                <span className="jp-GPUJobs-qUser">{job.user === props.me ? 'you' : job.user}</span>
                {' · '}
                {gpuRequest(job)}
                {job.priority && job.priority !== 'normal' && (
                  <span className={`jp-GPUJobs-prio jp-mod-${job.priority}`}>{job.priority}</span>
                )}
              </div>
              {job.reason && (
                <div className="jp-GPUJobs-qReason" title={job.reason}>
                  {job.reason}
                </div>
              )}
            </td>
            <td
              className="jp-GPUJobs-starts"
              title={`expected start: ${formatStart(
                job.expected_start,
                props.now,
                job.expected_start_kind,
                job.expected_start_range
              )}${job.expected_start_note ? `; ${job.expected_start_note}` : ''}`}
            >
              {formatStartShort(job.expected_start, props.now, job.expected_start_kind)}
            </td>
          </tr>
        ))}
      </tbody>
      {props.total > props.jobs.length && (
        <tfoot>
          <tr>
            <td colSpan={3} className="jp-GPUJobs-hint">
              the first {props.jobs.length} of {props.total} pending jobs
            </td>
          </tr>
        </tfoot>
      )}
    </table>
  );
}

// ------------------------------------------------------------------ quota

function plural(n: number, word: string): string {
  return `${n} ${word}${n === 1 ? '' : 's'}`;
}

/**
 * My quota in words: "2 of 4 GPUs in use; no limit set", "1 of 2 GPUs in use (your limit;
 * 4 on this server)", with a bar each.
 */
function Quota(props: { quota: IQuota | null; gpusOnServer: number }): React.ReactElement {
  const q = props.quota;
  if (!q) {
    return <div className="jp-GPUJobs-hint">No quota information.</div>;
  }
  const onServer = q.total_gpus ?? props.gpusOnServer;
  const gpuLimit = q.max_gpus ?? null;
  const gpuMax = gpuLimit ?? Math.max(onServer, q.running_gpus, 1);
  const gpuText =
    gpuLimit !== null
      ? `${q.running_gpus} of ${plural(gpuLimit, 'GPU')} in use (your limit; ${onServer} on this server)`
      : `${q.running_gpus} of ${plural(onServer, 'GPU')} in use; no limit set`;
  const jobLimit = q.max_running_jobs ?? null;
  const jobText =
    jobLimit !== null
      ? `${q.running_jobs} of ${plural(jobLimit, 'running job')} (your limit)`
      : `${plural(q.running_jobs, 'running job')}; no limit set`;
  return (
    <div className="jp-GPUJobs-quota">
      <QuotaBar
        label="GPUs"
        text={gpuText}
        value={q.running_gpus}
        max={gpuMax}
        guarantee={q.guaranteed_gpus}
        borrowed={q.borrowed_gpus > 0}
        name="gpus"
      />
      <QuotaBar
        label="Jobs"
        text={jobText}
        value={q.running_jobs}
        max={jobLimit ?? Math.max(q.running_jobs, 1)}
        name="jobs"
        bar={jobLimit !== null}
      />
      <ul className="jp-GPUJobs-quotaFacts">
        <li>
          {q.guaranteed_gpus
            ? `${plural(q.guaranteed_gpus, 'GPU')} guaranteed to you (the marker on the bar)`
            : 'no GPUs guaranteed: you use what is free'}
        </li>
        {q.borrowed_gpus > 0 && (
          <li>{plural(q.borrowed_gpus, 'GPU')} borrowed beyond your share (may be preempted)</li>
        )}
        <li>
          {q.pending_jobs
            ? `${plural(q.pending_jobs, 'job')} of yours waiting${q.pending_gpus ? ` for ${plural(q.pending_gpus, 'GPU')}` : ''}`
            : 'nothing of yours waiting'}
        </li>
        <li>
          {q.max_time_limit_s
            ? `time limit per job: at most ${formatDuration(q.max_time_limit_s)}`
            : 'no maximum time limit per job'}
        </li>
      </ul>
      {(q.budgets ?? []).map(b => (
        <QuotaBar
          key={`${b.scope}:${b.name}`}
          label={`${b.scope === 'users' ? 'My' : b.name} GPU-hours`}
          text={
            `${b.left_gpu_hours.toFixed(1)} of ${b.gpu_hours} GPU-hours left this ${b.period === 'dates' ? 'term' : b.period}` +
            (b.used_up ? (b.mode === 'low' ? ' (used up: jobs run at low priority)' : ' (used up: jobs wait)') : '')
          }
          value={b.used_gpu_hours}
          max={b.gpu_hours}
          borrowed={b.used_up}
          name="budget"
        />
      ))}
    </div>
  );
}

function QuotaBar(props: {
  label: string;
  text: string;
  value: number;
  max: number;
  guarantee?: number;
  borrowed?: boolean;
  name: string;
  bar?: boolean;
}): React.ReactElement {
  const max = Math.max(props.max, 1);
  const fraction = Math.min(1, props.value / max);
  const over = !!props.borrowed;
  return (
    <div className={`jp-GPUJobs-quotaRow jp-GPUJobs-quota-${props.name}`}>
      <div className="jp-GPUJobs-quotaLabel">
        <span className="jp-GPUJobs-quotaName">{props.label}</span>
        <span className="jp-GPUJobs-quotaValue">{props.text}</span>
      </div>
      {props.bar !== false && (
        <div className="jp-GPUJobs-bar jp-GPUJobs-quotaBar">
          <div
            className={`jp-GPUJobs-barFill ${over ? 'jp-mod-borrowed' : 'jp-mod-low'}`}
            style={{ width: `${(fraction * 100).toFixed(1)}%` }}
          />
          {props.guarantee !== undefined && props.guarantee > 0 && (
            <div
              className="jp-GPUJobs-guarantee"
              title={`guaranteed: ${props.guarantee}`}
              style={{ left: `${Math.min(100, (props.guarantee / max) * 100).toFixed(1)}%` }}
            />
          )}
        </div>
      )}
    </div>
  );
}

// ----------------------------------------------------------- reservations

/** When a reservation is on: "now, until 18:00", or its next occurrence. */
export function reservationWhen(r: IReservation, now: number): string {
  const fmt = (t: number) => formatClock(t, true);
  const every = r.repeat ? ` (${r.repeat})` : '';
  if (r.next_start === null || r.next_end === null) {
    return 'over';
  }
  if (r.active || (r.next_start <= now && now < r.next_end)) {
    return `now, for ${formatDuration(r.next_end - now)} more${every}`;
  }
  return `${fmt(r.next_start)} – ${fmt(r.next_end)}, in ${formatDuration(r.next_start - now)}${every}`;
}

export function Reservations(props: {
  reservations: IReservation[];
  now: number;
  me: string | null;
}): React.ReactElement {
  return (
    <ul className="jp-GPUJobs-reservations">
      {props.reservations.map(r => {
        const on = r.active || (r.next_start !== null && r.next_start <= props.now && props.now < (r.next_end ?? 0));
        const mine = !!props.me && r.users.includes(props.me);
        return (
          <li
            key={r.id}
            className={`jp-GPUJobs-reservation ${on ? 'jp-mod-active' : ''}`}
            data-reservation-id={r.id}
          >
            <div className="jp-GPUJobs-reservationHead">
              <span className="jp-GPUJobs-reservationName">{r.label || r.name || `reservation ${r.id}`}</span>
              {on && <span className="jp-GPUJobs-tag jp-mod-warn">on now</span>}
              {mine && <span className="jp-GPUJobs-tag jp-mod-free">yours</span>}
            </div>
            <div className="jp-GPUJobs-reservationMeta">
              {r.gpus}×{r.gpu_type || 'GPU'}
              {r.holders ? ` for ${r.holders}` : ''}
              {r.assigned?.text ? ` · ${r.assigned.text}` : ''}
            </div>
            <div className="jp-GPUJobs-reservationWhen">{reservationWhen(r, props.now)}</div>
          </li>
        );
      })}
    </ul>
  );
}

// ---------------------------------------------------------- notifications

function NotificationSettings(props: { model: GPUJobsModel }): React.ReactElement {
  const { model } = props;
  const n = model.notifications;
  const [message, setMessage] = React.useState<string | null>(null);
  const on = !!n && (!!n.email || !!n.webhook);
  const act = async (action: () => Promise<string | null>) => {
    try {
      setMessage(await action());
    } catch (error) {
      setMessage((error as Error).message);
    }
  };
  return (
    <div className="jp-GPUJobs-notify" data-on={on}>
      <div className="jp-GPUJobs-notifyText">{describeNotifications(n)}</div>
      {!on && (
        <div className="jp-GPUJobs-hint">
          Get an e-mail or a chat message when a job ends, fails or nears its time limit.
        </div>
      )}
      <div className="jp-GPUJobs-actions">
        <button
          className="jp-GPUJobs-button jp-mod-accept"
          data-action="notify-edit"
          onClick={() =>
            void act(async () => {
              const saved = n && (await editNotifications(n));
              if (saved) {
                await model.refreshNotifications();
                return 'Saved.';
              }
              return null;
            })
          }
        >
          {on ? 'Change…' : 'Notify me…'}
        </button>
        {on && (
          <button
            className="jp-GPUJobs-button"
            data-action="notify-test"
            onClick={() =>
              void act(async () => {
                const { queued } = await api.testNotifications();
                return `Test message sent (${queued.join(' and ')}).`;
              })
            }
          >
            Send a test
          </button>
        )}
        {on && (
          <button
            className="jp-GPUJobs-button jp-mod-warn"
            data-action="notify-off"
            onClick={() =>
              void act(async () => {
                await api.notificationsOff();
                await model.refreshNotifications();
                return 'Turned off.';
              })
            }
          >
            Turn off
          </button>
        )}
      </div>
      {message && <div className="jp-GPUJobs-hint jp-GPUJobs-notifyMessage">{message}</div>}
    </div>
  );
}
