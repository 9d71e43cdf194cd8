/** Status bar item "GPU: 1 running · 2 queued" for the current user; a click opens the panel. */
import * as React from 'react';
import { ReactWidget, UseSignal } from '@jupyterlab/ui-components';
import { gpuIcon } from './icons';
import { GPUJobsModel } from './model';

export class GPUStatus extends ReactWidget {
  constructor(
    private readonly _model: GPUJobsModel,
    private readonly _open: () => void
  ) {
    super();
    this.addClass('jp-GPUJobs-status');
    this.node.title = 'My GPU jobs: click to open the GPU Jobs panel';
  }

  protected render(): React.ReactElement {
    return (
      <UseSignal signal={this._model.changed}>
        {() => {
          const m = this._model;
          const text = m.error && m.error.unreachable
            ? 'GPU: engine unreachable'
            : `GPU: ${m.runningCount} running · ${m.pendingCount} queued` +
              (m.heldCount ? ` · ${m.heldCount} held` : '');
          return (
            <span className="jp-GPUJobs-statusInner" onClick={this._open}>
              <gpuIcon.react tag="span" className="jp-GPUJobs-statusIcon" />
              <span className="jp-GPUJobs-statusText">{text}</span>
            </span>
          );
        }}
      </UseSignal>
    );
  }
}
