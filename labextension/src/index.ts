/**
 * jupyter-gpujobs for JupyterLab 4: the "GPU Jobs" sidebar, the GPU dashboard (main area),
 * the status bar item, "Run on GPU queue…" for notebooks (file browser context menu, notebook
 * toolbar, palette), the live job log viewer, and notifications about my jobs.
 */
import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import {
  Dialog,
  ICommandPalette,
  IThemeManager,
  InputDialog,
  MainAreaWidget,
  Notification,
  ToolbarButton,
  WidgetTracker,
  showDialog,
  showErrorMessage
} from '@jupyterlab/apputils';
import { IDocumentManager } from '@jupyterlab/docmanager';
import { IDefaultFileBrowser } from '@jupyterlab/filebrowser';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';
import { DisposableDelegate } from '@lumino/disposable';
import { FINAL_STATES, IFinding, IJob } from './api';
import { DashboardModel, GPUDashboard } from './dashboard';
import { formatDuration, jobLabel } from './format';
import { chartIcon, gpuIcon } from './icons';
import { LogView, createLogWidget } from './log';
import { GPUJobsModel, IJobChange } from './model';
import { GPUJobsPanel } from './panel';
import { GPUStatus } from './status';
import { runOnGPUQueue } from './submit';

const PLUGIN_ID = 'jupyter-gpujobs:plugin';

export namespace CommandIDs {
  export const openPanel = 'gpujobs:open-panel';
  export const openDashboard = 'gpujobs:open-dashboard';
  export const submitNotebook = 'gpujobs:submit-notebook';
  export const cancelJob = 'gpujobs:cancel-job';
  export const openLog = 'gpujobs:open-log';
  export const openOutput = 'gpujobs:open-output';
  export const refresh = 'gpujobs:refresh';
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'GPU job queue: sidebar, status bar, run notebooks on the GPU queue, notifications.',
  autoStart: true,
  optional: [
    ILayoutRestorer,
    ICommandPalette,
    IStatusBar,
    ISettingRegistry,
    IDocumentManager,
    IDefaultFileBrowser,
    INotebookTracker,
    IThemeManager
  ],
  activate: (
    app: JupyterFrontEnd,
    restorer: ILayoutRestorer | null,
    palette: ICommandPalette | null,
    statusBar: IStatusBar | null,
    settingRegistry: ISettingRegistry | null,
    docManager: IDocumentManager | null,
    fileBrowser: IDefaultFileBrowser | null,
    notebooks: INotebookTracker | null,
    themes: IThemeManager | null
  ) => {
    const { commands, shell } = app;
    const model = new GPUJobsModel(5);
    let notify = true;

    const logs = new WidgetTracker<MainAreaWidget<LogView>>({ namespace: 'gpujobs-log' });

    const openLog = (job: Pick<IJob, 'id' | 'name'>) => {
      const existing = logs.find(w => w.content.jobId === job.id);
      if (existing) {
        shell.activateById(existing.id);
        return;
      }
      const widget = createLogWidget(job);
      void logs.add(widget);
      shell.add(widget, 'main');
      shell.activateById(widget.id);
    };

    const openOutput = (job: IJob) => {
      if (!job.output_notebook) {
        return;
      }
      if (docManager) {
        docManager.openOrReveal(job.output_notebook);
      } else {
        void commands.execute('docmanager:open', { path: job.output_notebook });
      }
    };

    const cancel = async (job: IJob) => {
      if (job.state === 'RUNNING') {
        const answer = await showDialog({
          title: `Cancel job #${job.id}?`,
          body: `${jobLabel(job)} is running on GPU ${job.assigned_gpus.join(', ')}; cancelling stops it.`,
          buttons: [
            Dialog.cancelButton({ label: 'Keep running' }),
            Dialog.warnButton({ label: 'Cancel job' })
          ]
        });
        if (!answer.button.accept) {
          return;
        }
      }
      try {
        await model.cancel(job.id);
      } catch (error) {
        void showErrorMessage(`Cannot cancel job #${job.id}`, (error as Error).message);
      }
    };

    // The dashboard: one view in the main area (its tracker holds it while it is open, for the
    // layout restorer too), its model alive while it is open.
    const dashboards = new WidgetTracker<MainAreaWidget<GPUDashboard>>({ namespace: 'gpujobs-dashboard' });
    const themeName = () => themes?.theme ?? document.body.dataset.jpThemeName ?? '';
    const openDashboard = () => {
      const open = dashboards.find(() => true);
      if (open) {
        shell.activateById(open.id);
        return;
      }
      const dashModel = new DashboardModel(model);
      const content = new GPUDashboard(dashModel, { openPanel: () => openPanel() }, themeName);
      const widget = new MainAreaWidget({ content });
      widget.id = 'gpujobs-dashboard-area';
      widget.title.label = content.title.label;
      widget.title.icon = content.title.icon;
      widget.title.caption = content.title.caption;
      widget.title.closable = true;
      const onTheme = () => content.themeChanged();
      themes?.themeChanged.connect(onTheme);
      widget.disposed.connect(() => {
        themes?.themeChanged.disconnect(onTheme);
        dashModel.dispose();
      });
      void dashboards.add(widget);
      shell.add(widget, 'main');
      shell.activateById(widget.id);
      dashModel.start();
    };

    const panel = new GPUJobsPanel(model, {
      cancel: job => void cancel(job),
      hold: (job, hold) =>
        void model.hold(job.id, hold).catch(error =>
          showErrorMessage(`Cannot ${hold ? 'hold' : 'release'} job #${job.id}`, (error as Error).message)
        ),
      openLog,
      openOutput,
      openDashboard,
      retry: () => void model.refresh()
    });
    shell.add(panel, 'left', { rank: 900 });
    if (restorer) {
      restorer.add(panel, 'gpujobs-panel');
      // a reload reopens the dashboard and the job logs where they were
      void restorer.restore(dashboards, { command: CommandIDs.openDashboard, name: () => 'dashboard' });
      void restorer.restore(logs, {
        command: CommandIDs.openLog,
        args: widget => ({ id: widget.content.jobId }),
        name: widget => String(widget.content.jobId)
      });
    }

    const openPanel = () => shell.activateById(panel.id);

    // -------------------------------------------------------------- commands
    commands.addCommand(CommandIDs.openPanel, {
      label: 'Open the GPU Jobs panel',
      caption: 'GPUs, my jobs, the queue and my quota',
      icon: gpuIcon,
      execute: openPanel
    });

    commands.addCommand(CommandIDs.openDashboard, {
      label: 'Open the GPU dashboard',
      caption: 'GPU use over time, the queue, usage per user and group, the monitor’s findings',
      icon: chartIcon,
      execute: openDashboard
    });

    commands.addCommand(CommandIDs.refresh, {
      label: 'Refresh GPU jobs',
      execute: () => model.refresh()
    });

    const notebookPath = (args: any): string | null => {
      if (args && typeof args.path === 'string' && args.path) {
        return args.path;
      }
      if (fileBrowser) {
        const item = fileBrowser.selectedItems().next();
        if (item && !item.done && item.value.path.endsWith('.ipynb')) {
          return item.value.path;
        }
      }
      const current = notebooks?.currentWidget;
      return current ? current.context.path : null;
    };

    commands.addCommand(CommandIDs.submitNotebook, {
      label: args => (args && args.isPalette ? 'Run notebook on GPU queue…' : 'Run on GPU queue…'),
      caption: 'Queue this notebook to run on GPUs',
      icon: gpuIcon,
      execute: async args => {
        const path = notebookPath(args);
        if (!path) {
          void showErrorMessage(
            'Run on GPU queue',
            'Select a notebook (.ipynb) in the file browser or open one first.'
          );
          return;
        }
        // Run what is on disk: save an open, modified notebook first.
        const open = notebooks?.find(w => w.context.path === path);
        if (open && open.context.model.dirty) {
          await open.context.save();
        }
        try {
          const job = await runOnGPUQueue(path);
          if (job) {
            model.refreshSoon(0);
            if (notify) {
              Notification.info(
                `Job #${job.id} ${jobLabel(job)} queued${job.reason ? `: ${job.reason}` : ''}`,
                { autoClose: 4000 }
              );
            }
            openPanel();
          }
        } catch (error) {
          void showErrorMessage('Could not submit the notebook', (error as Error).message);
        }
      }
    });

    commands.addCommand(CommandIDs.cancelJob, {
      label: 'Cancel a GPU job…',
      execute: async args => {
        let id = args && args.id !== undefined ? Number(args.id) : NaN;
        if (isNaN(id)) {
          const active = model.myJobs.filter(j => !FINAL_STATES.has(j.state));
          if (active.length === 0) {
            Notification.info('You have no pending or running GPU job to cancel.', {
              autoClose: 4000
            });
            return;
          }
          const labels = active.map(j => `#${j.id} ${jobLabel(j)} (${j.state.toLowerCase()})`);
          const choice = await InputDialog.getItem({
            title: 'Cancel which GPU job?',
            items: labels,
            okLabel: 'Cancel job'
          });
          if (!choice.button.accept || !choice.value) {
            return;
          }
          id = active[labels.indexOf(choice.value)].id;
        }
        try {
          await model.cancel(id);
        } catch (error) {
          void showErrorMessage(`Cannot cancel job #${id}`, (error as Error).message);
        }
      }
    });

    commands.addCommand(CommandIDs.openLog, {
      label: 'Open a GPU job log',
      execute: args => {
        const id = Number(args.id);
        if (!isNaN(id)) {
          openLog({ id, name: model.job(id)?.name ?? null });
        }
      }
    });

    commands.addCommand(CommandIDs.openOutput, {
      label: 'Open the output notebook of a GPU job',
      execute: args => {
        const job = model.job(Number(args.id));
        if (job) {
          openOutput(job);
        }
      }
    });

    if (palette) {
      const category = 'GPU Jobs';
      palette.addItem({ command: CommandIDs.openPanel, category });
      palette.addItem({ command: CommandIDs.openDashboard, category });
      palette.addItem({ command: CommandIDs.submitNotebook, category, args: { isPalette: true } });
      palette.addItem({ command: CommandIDs.cancelJob, category });
      palette.addItem({ command: CommandIDs.refresh, category });
    }

    app.contextMenu.addItem({
      command: CommandIDs.submitNotebook,
      selector: '.jp-DirListing-item[data-file-type="notebook"]',
      rank: 3
    });

    // Notebook toolbar button.
    app.docRegistry.addWidgetExtension('Notebook', {
      createNew: (nb: NotebookPanel) => {
        const button = new ToolbarButton({
          className: 'jp-GPUJobs-runButton',
          icon: gpuIcon,
          label: 'GPU queue',
          tooltip: 'Run on GPU queue…',
          onClick: () =>
            void commands.execute(CommandIDs.submitNotebook, { path: nb.context.path })
        });
        nb.toolbar.insertAfter('cellType', 'gpujobs-run', button);
        return new DisposableDelegate(() => button.dispose());
      }
    });

    // ------------------------------------------------------------ status bar
    if (statusBar) {
      statusBar.registerStatusItem('jupyter-gpujobs:status', {
        item: new GPUStatus(model, openPanel),
        align: 'left',
        rank: 5,
        isActive: () => true
      });
    }

    // --------------------------------------------------------- notifications
    model.jobChanged.connect((_, change) => {
      if (notify) {
        notifyChange(change, openLog, openOutput);
      }
    });
    model.findingOpened.connect((_, finding) => {
      if (notify) {
        notifyFinding(finding, model.job(finding.job_id ?? NaN), openLog);
      }
    });

    // -------------------------------------------------------------- settings
    if (settingRegistry) {
      settingRegistry
        .load(PLUGIN_ID)
        .then(settings => {
          const apply = () => {
            notify = settings.get('notifications').composite !== false;
            model.refreshSeconds = Number(settings.get('refreshInterval').composite) || 5;
          };
          apply();
          settings.changed.connect(apply);
        })
        .catch(reason => console.warn('gpujobs: cannot load settings', reason));
    }

    model.start();
  }
};

function notifyChange(
  change: IJobChange,
  openLog: (job: IJob) => void,
  openOutput: (job: IJob) => void
): void {
  const { job, state, reason } = change;
  const label = `Job #${job.id} ${jobLabel(job)}`;
  const logAction = { label: 'Show log', callback: () => openLog(job) };
  const actions: Notification.IAction[] = job.kind === 'kernel' ? [] : [logAction];
  switch (state) {
    case 'RUNNING':
      if (change.previous === 'RUNNING') {
        return;
      }
      Notification.info(
        `${label} started${job.assigned_gpus.length ? ` on GPU ${job.assigned_gpus.join(', ')}` : ''}`,
        { autoClose: 5000, actions }
      );
      return;
    case 'COMPLETED': {
      const ran =
        job.started_at && job.ended_at ? ` in ${formatDuration(job.ended_at - job.started_at)}` : '';
      if (job.kind === 'notebook' && job.output_notebook) {
        actions.push({ label: 'Open output', callback: () => openOutput(job) });
      }
      Notification.success(`${label} completed${ran}`, { autoClose: 6000, actions });
      return;
    }
    case 'FAILED':
    case 'LOST':
      Notification.error(`${label} failed: ${reason || job.reason || 'unknown reason'}`, {
        autoClose: 15000,
        actions
      });
      return;
    case 'TIMEOUT':
      Notification.error(`${label} stopped: ${reason || 'time limit reached'}`, {
        autoClose: 15000,
        actions
      });
      return;
    case 'CANCELLED':
      Notification.info(`${label} cancelled${reason ? `: ${reason}` : ''}`, { autoClose: 5000 });
      return;
    case 'WARNING':
      Notification.warning(`${label}: ${reason || 'near its time limit'}`, {
        autoClose: 10000,
        actions
      });
      return;
    case 'PENDING':
      if (change.previous === 'RUNNING') {
        Notification.warning(`${label} went back to the queue${reason ? `: ${reason}` : ''}`, {
          autoClose: 8000
        });
      }
      return;
  }
}

/** JupyterLab cuts longer notification messages. */
const NOTIFICATION_MAX_LENGTH = 140;

/** A finding of the monitor about my job, in its own words, at the level of its severity. */
function notifyFinding(
  finding: IFinding,
  job: IJob | undefined,
  openLog: (job: Pick<IJob, 'id' | 'name'>) => void
): void {
  const actions: Notification.IAction[] = [];
  if (finding.job_id !== null && job?.kind !== 'kernel') {
    const id = finding.job_id;
    actions.push({ label: 'Show log', callback: () => openLog({ id, name: job?.name ?? null }) });
  }
  if (finding.message.length > NOTIFICATION_MAX_LENGTH) {
    actions.push({
      label: 'Details',
      callback: () =>
        void showDialog({
          title: finding.job_id !== null ? `Job #${finding.job_id}` : 'GPU monitor',
          body: finding.message,
          buttons: [Dialog.okButton()]
        })
    });
  }
  const options = { autoClose: finding.severity === 'info' ? 6000 : 15000, actions };
  const notify =
    finding.severity === 'error'
      ? Notification.error
      : finding.severity === 'info'
        ? Notification.info
        : Notification.warning;
  notify(finding.message, options);
}

export default plugin;
