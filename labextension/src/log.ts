/**
 * A main-area viewer of a job's log that follows it live: it polls
 * `jobs/{id}/log?offset=N` and appends what is new until the server says the log is done.
 * Until the job writes something it says so ("No output yet"), not a blank page.
 */
import { MainAreaWidget } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';
import { APIError, IJob, api } from './api';
import { gpuIcon } from './icons';

const POLL_MS = 1000;
const MAX_CHARS = 2_000_000;

export class LogView extends Widget {
  constructor(readonly jobId: number) {
    super();
    this.addClass('jp-GPUJobs-log');
    this._status = document.createElement('div');
    this._status.className = 'jp-GPUJobs-logStatus';
    this._pre = document.createElement('pre');
    this._pre.className = 'jp-GPUJobs-logText';
    this._empty = document.createElement('div');
    this._empty.className = 'jp-GPUJobs-logEmpty';
    this._empty.hidden = true;
    this.node.append(this._status, this._empty, this._pre);
    this.node.tabIndex = 0;
    this._setStatus('loading…');
    void this._poll();
  }

  get done(): boolean {
    return this._done;
  }

  dispose(): void {
    window.clearTimeout(this._timer);
    super.dispose();
  }

  private _setStatus(text: string): void {
    this._status.textContent = `job #${this.jobId} · ${text}`;
  }

  private async _poll(): Promise<void> {
    if (this.isDisposed) {
      return;
    }
    try {
      const chunk = await api.log(this.jobId, this._offset);
      if (chunk.data) {
        const follow =
          this.node.scrollTop + this.node.clientHeight >= this.node.scrollHeight - 24;
        this._pre.append(document.createTextNode(chunk.data));
        if ((this._pre.textContent || '').length > MAX_CHARS) {
          this._pre.textContent = (this._pre.textContent || '').slice(-MAX_CHARS);
        }
        if (follow) {
          this.node.scrollTop = this.node.scrollHeight;
        }
      }
      this._offset = chunk.offset;
      this._done = chunk.done;
      const blank = !this._pre.textContent;
      this._empty.hidden = !blank;
      this._empty.textContent = chunk.done ? 'The job wrote no output.' : 'No output yet: what the job prints shows here as it comes.';
      if (chunk.done) {
        let state = '';
        try {
          const job: IJob = await api.job(this.jobId);
          state = ` (${job.state.toLowerCase()}${job.reason ? `: ${job.reason}` : ''})`;
        } catch {
          // the log is what matters here
        }
        this._setStatus(`finished${state}`);
        this.node.dataset.done = 'true';
        return;
      }
      this._setStatus('following live');
      this._errors = 0;
    } catch (error) {
      this._errors += 1;
      const message = error instanceof APIError ? error.message : String(error);
      this._setStatus(`cannot read the log: ${message} (retrying)`);
    }
    const delay = Math.min(POLL_MS * Math.max(1, this._errors * 2), 10000);
    this._timer = window.setTimeout(() => void this._poll(), delay);
  }

  private _status: HTMLDivElement;
  private _pre: HTMLPreElement;
  private _empty: HTMLDivElement;
  private _offset = 0;
  private _done = false;
  private _errors = 0;
  private _timer = 0;
}

export function createLogWidget(job: Pick<IJob, 'id' | 'name'>): MainAreaWidget<LogView> {
  const content = new LogView(job.id);
  const widget = new MainAreaWidget({ content });
  widget.id = `gpujobs-log-${job.id}`;
  widget.title.label = `Log: job ${job.id}${job.name ? ` ${job.name}` : ''}`;
  widget.title.icon = gpuIcon;
  widget.title.closable = true;
  return widget;
}
